"""Generated NetworkPolicy sets on the conformance node, every matrix against the model.

Like the cyclonus conformance generator on a small scale: each case is 1-3 policies drawn from the
shapes v1 allows (selectors with every operator, namespace AND pod peers, ipBlocks with
excepts over the Pods' own addresses, numeric, ranged, named and protocol-only ports, each
policyTypes combination, empty and allow-all rules), applied through the store, and the full
matrix (9 x 9 Pods x 3 ports, IPv4 and IPv6) probed with real connects must equal
``netpol.evaluate``. The default suite runs ``PYCNI_NETPOL_CASES`` (2) cases; ``make
netpol-matrix`` runs 40. The seed is printed; ``PYCNI_NETPOL_SEED=<n>`` replays a run.

The tracer is checked against the same packets: for every cell, what
``pycni netpol trace`` answers (``netpol.ops.trace.trace`` on the node's store, the code
behind ``--output json``) must be what the packet got; and a batch of cells probed alone
(distinct sources, distinct destinations, so each Pod's counter counts one cell at most) must
move the drop counter the trace names: a cell the source's egress denies,
``dropped-eg/<ns>/<src>``; one the destination's ingress denies, ``dropped-in/<ns>/<dst>``; an
allowed one, neither. Under ``make long`` (``tests/fixtures/scale.py``) the default is 12 cases
of 3 batches each.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

from netpol.ops.trace import trace
from tests.fixtures.scale import sized
from tests.netns.netpol_cluster import (
    NAMED,
    NAMESPACES,
    PODS,
    Cell,
    NetpolNode,
    make_node,
    policy,
)

pytestmark = pytest.mark.netns
CASES = int(os.environ.get("PYCNI_NETPOL_CASES", str(sized(2, 12))))
BATCHES = sized(1, 3)  # cells probed alone against the drop counters, per case
SEED = int(os.environ.get("PYCNI_NETPOL_SEED", str(random.SystemRandom().randrange(10**6))))


@pytest.fixture(scope="module")
def npnode(cni_bin: str, cni_path: str) -> Iterator[NetpolNode]:
    made = make_node(cni_bin, cni_path)
    yield made
    made.close()


def selector(rng: random.Random, key: str, values: tuple[str, ...]) -> dict[str, Any]:
    kind = rng.choice(["empty", "labels", "in", "notin", "exists", "doesnotexist"])
    if kind == "empty":
        return {}
    if kind == "labels":
        return {"matchLabels": {key: rng.choice(values)}}
    operator = {"in": "In", "notin": "NotIn", "exists": "Exists", "doesnotexist": "DoesNotExist"}
    expression: dict[str, Any] = {"key": key, "operator": operator[kind]}
    if kind in ("in", "notin"):
        expression["values"] = sorted(set(rng.sample(values, rng.randint(1, 2))))
    elif kind == "doesnotexist":
        expression["key"] = rng.choice([key, "absent"])
    return {"matchExpressions": [expression]}


def peer(rng: random.Random, node: NetpolNode) -> dict[str, Any]:
    kind = rng.choice(["pod", "ns", "both", "block"])
    if kind == "block":
        excepts = rng.sample(sorted(node.pods), rng.randint(0, 2))
        block: dict[str, Any] = {"cidr": "10.22.0.0/24"}
        if excepts:
            block["except"] = [f"{node.pods[p].ip}/32" for p in excepts]
        if rng.random() < 0.3:
            block = {"cidr": f"{node.pods[rng.choice(sorted(node.pods))].ip}/32"}
        return {"ipBlock": block}
    found: dict[str, Any] = {}
    if kind in ("pod", "both"):
        found["podSelector"] = selector(rng, "pod", PODS)
    if kind in ("ns", "both"):
        found["namespaceSelector"] = selector(rng, "ns", NAMESPACES)
    return found


def port(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["number", "range", "named", "protocol"])
    if kind == "number":
        return {"port": rng.choice([80, 81]), "protocol": rng.choice(["TCP", "UDP"])}
    if kind == "range":
        return {"port": 80, "endPort": 81}
    if kind == "named":
        name = rng.choice(sorted(NAMED))
        return {"port": name, "protocol": rng.choice([NAMED[name][0], "TCP", "UDP"])}
    return {"protocol": rng.choice(["TCP", "UDP"])}


def rule(rng: random.Random, node: NetpolNode, peers_key: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if rng.random() < 0.7:
        found[peers_key] = [peer(rng, node) for _ in range(rng.randint(1, 2))]
    if rng.random() < 0.6:
        found["ports"] = [port(rng) for _ in range(rng.randint(1, 2))]
    return found


def generate(rng: random.Random, node: NetpolNode, count: int) -> list[dict[str, Any]]:
    made = []
    for index in range(count):
        types = rng.choice([["Ingress"], ["Egress"], ["Ingress", "Egress"]])
        spec: dict[str, Any] = {
            "podSelector": selector(rng, "pod", PODS),
            "policyTypes": types,
        }
        for direction, key in (("Ingress", "from"), ("Egress", "to")):
            if direction in types:
                spec[direction.lower()] = [rule(rng, node, key) for _ in range(rng.randint(0, 2))]
        made.append(policy(rng.choice(NAMESPACES), f"gen{index}", **spec))
    return made


def trace_args(node: NetpolNode, cell: Cell) -> tuple[str, str]:
    """``--from`` and ``--to`` of ``pycni netpol trace`` for one cell."""
    src, dst, protocol, port, family = cell
    ip = node.pods[dst].address(family)
    host = f"[{ip}]" if family == 6 else ip
    return node.pods[src].address(family), f"{host}:{port}/{protocol.lower()}"


def check_tracer(node: NetpolNode, found: dict[Cell, bool]) -> dict[Cell, dict[str, Any]]:
    """Every cell's trace, which must say what the packet got."""
    docs = {cell: trace(node.store, *trace_args(node, cell)) for cell in found}
    wrong = {c: (d["allowed"], found[c]) for c, d in docs.items() if d["allowed"] != found[c]}
    assert not wrong, f"tracer != kernel (cell: (tracer, kernel)): {wrong}"
    return docs


def calc_batch(rng: random.Random, docs: dict[Cell, dict[str, Any]]) -> list[Cell]:
    """Up to 9 cells, denied ones first, no two of one source or one destination."""
    cells = rng.sample(sorted(docs), len(docs))
    cells.sort(key=lambda cell: docs[cell]["allowed"])  # stable: random within each kind
    batch: list[Cell] = []
    for cell in cells:
        if all(cell[0] != b[0] and cell[1] != b[1] for b in batch):
            batch.append(cell)
    return batch


def counter_moved(node: NetpolNode, cell: Cell, doc: dict[str, Any]) -> dict[str, bool]:
    """The counters the trace says this cell moves (True) or leaves (False)."""
    src, dst = (node.pods[ref] for ref in cell[:2])
    egress, ingress = f"dropped-eg/{src.ref}", f"dropped-in/{dst.ref}"
    denied_by_egress = not doc["egress"]["allowed"]
    return {
        egress: denied_by_egress,
        ingress: not doc["allowed"] and not denied_by_egress,  # egress drops it first
    }


def check_counters(node: NetpolNode, rng: random.Random, docs: dict[Cell, Any]) -> int:
    """One batch probed alone; each counter moved exactly where the trace says. Returns the
    number of denied cells in it."""
    batch = calc_batch(rng, docs)
    before = node.drop_counters()
    node.probe_matrix(batch, timeout=0.5)
    after = node.drop_counters()
    wrong = {}
    for cell in batch:
        for name, moves in counter_moved(node, cell, docs[cell]).items():
            delta = after.get(name, 0) - before.get(name, 0)
            if (delta > 0) != moves:
                wrong[(cell, name)] = delta
    assert not wrong, f"drop counters != trace ((cell, counter): packets counted): {wrong}"
    return sum(not docs[cell]["allowed"] for cell in batch)


def run_case(node: NetpolNode, case: int, seed: int, batches: int) -> None:
    rng = random.Random(seed * 1000 + case)
    manifests = generate(rng, node, rng.randint(1, 3))
    print(f"netpol generated case {case} (PYCNI_NETPOL_SEED={seed}): {manifests}")
    found = node.check_matrix(node.set_policies(*manifests), families=(4, 6))
    started = time.monotonic()
    docs = check_tracer(node, found)
    traced = time.monotonic() - started
    denied = sum(check_counters(node, rng, docs) for _ in range(batches))
    print(
        f"  traced {len(docs)} cells in {traced:.1f} s; {denied} denied cells seen on the drop "
        f"counters ({time.monotonic() - started - traced:.1f} s)"
    )


@pytest.mark.long
@pytest.mark.parametrize("case", range(CASES))
def test_generated_policies_match_the_model_the_tracer_and_the_counters(
    npnode: NetpolNode, case: int
) -> None:
    run_case(npnode, case, SEED, BATCHES)

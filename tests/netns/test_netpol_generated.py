"""Generated NetworkPolicy sets on the conformance node, every matrix against the model.

Like cyclonus (NETPOL-NOTES §3.2) on a small scale: each case is 1-3 policies drawn from the
shapes v1 allows (selectors with every operator, namespace AND pod peers, ipBlocks with
excepts over the Pods' own addresses, numeric, ranged, named and protocol-only ports, each
policyTypes combination, empty and allow-all rules), applied through the store, and the full
matrix (9 x 9 Pods x 3 ports, IPv4 and IPv6) probed with real connects must equal
``netpol.evaluate``. The default suite runs ``PYCNI_NETPOL_CASES`` (2) cases; ``make
netpol-matrix`` runs 40. The seed is printed; ``PYCNI_NETPOL_SEED=<n>`` replays a run.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

import pytest

from tests.netns.netpol_cluster import NAMED, NAMESPACES, PODS, NetpolNode, make_node, policy

pytestmark = pytest.mark.netns
CASES = int(os.environ.get("PYCNI_NETPOL_CASES", "2"))
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


@pytest.mark.parametrize("case", range(CASES))
def test_generated_policies_match_the_model(npnode: NetpolNode, case: int) -> None:
    rng = random.Random(SEED * 1000 + case)
    manifests = generate(rng, npnode, rng.randint(1, 3))
    print(f"netpol generated case {case} (PYCNI_NETPOL_SEED={SEED}): {manifests}")
    npnode.check_matrix(npnode.set_policies(*manifests), families=(4, 6))

"""``render_diff`` (netpol/diff.py) brings the kernel where a full render does, in real netns.

Generated histories of clusters (tests/fixtures/netpol_cases.py: both families, named ports,
ipBlocks with excepts, Pods on this node or another) change step by step: Pods relabelled,
moved, removed and back, policies added, changed and removed, namespaces relabelled, the
node's addresses changed. One netns gets the first layout whole, then each step's diff
through one kept libnftables context (``netpol.sync.send_script``, as pycnid sends it); a
second gets each step's layout whole in a table made afresh. After each step both tables,
listed, must hold the same (set elements in any order, each chain's rules in order). Pod
addresses are adjacent, so peer intervals merge and split as Pods come and go.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from netpol.diff import render_diff
from netpol.render import Layout, calc_layout, render_full
from tests.fixtures.netns import new_netns
from tests.fixtures.netpol_cases import (
    API,
    NAMESPACES,
    clusters,
    inputs_of,
    ip_blocks,
    labels_of,
    manifests,
    policy_ports,
)
from tests.fixtures.netpol_cases import pods as all_pods
from tests.fixtures.netpol_reference import Cluster
from tests.fixtures.scale import sized

pytestmark = [pytest.mark.netns, pytest.mark.long]
ROOT = Path(__file__).resolve().parents[2]
NODE = "n1"
POLICY_NAMES = ("p1", "p2", "p3", "p4")
NODE_ADDRESSES = ("192.168.0.1", "192.168.0.2", "192.168.0.3", "fd01::1", "fd01::2")
HISTORIES = sized(6, 60)
STEPS = sized(5, 12)
#: In the netns: one JSON request a line ({"fresh": bool, "script": str}), one answer a line
#: (the table's listing after the script, or nft's error).
SERVER = """
import json, sys
from kernel.nft import Nft, NftError
from netpol.render import T
from netpol.sync import send_script

nft = Nft()
for line in sys.stdin:
    request = json.loads(line)
    try:
        if request["fresh"]:
            nft.run(f"add table {T}\\ndelete table {T}\\n")
        send_script(nft, request["script"])
        answer = {"listing": nft.list_json(f"list table {T}")}
    except NftError as exc:
        answer = {"error": str(exc)}
    print(json.dumps(answer), flush=True)
"""
Apply = Callable[[str, bool], dict[str, Any]]


@pytest.fixture(scope="module")
def tables() -> Iterator[tuple[Apply, Apply]]:
    """Two netns, each with its nft server; both deleted after the module, whatever failed."""
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    made: list[tuple[Any, subprocess.Popen[str]]] = []
    try:
        for role in ("npdiff", "npfull"):
            ns = new_netns(role)
            cmd = ["ip", "netns", "exec", ns.name, sys.executable, "-c", SERVER]
            server = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
            )
            made.append((ns, server))
        yield applier(made[0][1]), applier(made[1][1])
    finally:
        for ns, server in made:
            server.kill()
            server.communicate()  # waits, and closes its pipes
            ns.delete()


def applier(server: subprocess.Popen[str]) -> Apply:
    def apply(script: str, fresh: bool) -> dict[str, Any]:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(json.dumps({"fresh": fresh, "script": script}) + "\n")
        server.stdin.flush()
        return json.loads(server.stdout.readline())

    return apply


def normalise(answer: dict[str, Any]) -> dict[str, Any]:
    """What a table holds, whatever the order nft made it in: each object by kind and name,
    without handles; set elements sorted, chains as their rules' expressions in order."""
    assert "error" not in answer, answer["error"]
    found: dict[str, Any] = {}
    rules: dict[str, list[str]] = {}
    for obj in answer["listing"]["nftables"]:
        [(kind, body)] = obj.items()
        if kind == "rule":
            rules.setdefault(body["chain"], []).append(json.dumps(body["expr"], sort_keys=True))
        elif kind != "metainfo":
            body = {k: v for k, v in body.items() if k != "handle"}
            if "elem" in body:
                body["elem"] = sorted(json.dumps(e, sort_keys=True) for e in body["elem"])
            found[f"{kind} {body['name']}"] = body
    return {"objects": found, "rules": rules}


@st.composite
def focused(draw: Any, name: str) -> dict[str, Any]:
    """A policy isolating a whole namespace whose peers pick Pods by a label most Pods may
    or may not have (a relabel moves them in and out of its sets), or are ipBlocks."""
    pick = st.fixed_dictionaries(
        {"key": st.sampled_from(("app", "env")), "operator": st.sampled_from(("Exists", "In"))}
    ).map(lambda e: {**e, "values": ["web", "a"]} if e["operator"] == "In" else e)
    peer = st.one_of(
        pick.map(lambda e: {"podSelector": {"matchExpressions": [e]}}),
        pick.map(lambda e: {"podSelector": {"matchExpressions": [e]}, "namespaceSelector": {}}),
        ip_blocks().map(lambda b: {"ipBlock": b}),
    )
    rule = st.fixed_dictionaries(
        {"from": st.lists(peer, min_size=1, max_size=2)},
        optional={"ports": st.lists(policy_ports(), max_size=2)},
    )
    rules = draw(st.lists(rule, min_size=1, max_size=2))
    direction = draw(st.sampled_from(("ingress", "egress")))
    spec = {
        "podSelector": {},
        "policyTypes": [direction.capitalize()],
        direction: [{("to" if direction == "egress" else "from"): r["from"],
                     **({"ports": r["ports"]} if "ports" in r else {})} for r in rules],
    }  # fmt: skip
    metadata = {"name": name, "namespace": draw(st.sampled_from(NAMESPACES))}
    return {**API, "metadata": metadata, "spec": spec}


@st.composite
def next_cluster(draw: Any, before: Cluster) -> Cluster:
    """A few Pods redrawn (labels, ports, families, node) or removed; each policy kept,
    redrawn (added when absent) or removed; a namespace relabelled now and then."""
    fresh = draw(all_pods())
    changed = draw(st.sets(st.integers(0, 8), max_size=3))
    gone = draw(st.sets(st.integers(0, 8), max_size=1))
    held = {(p.namespace, p.name): p for p in before.pods}
    pods = []
    for k, pod in enumerate(fresh):
        old = held.get((pod.namespace, pod.name))
        if k in changed and k not in gone:
            pods.append(pod)
        elif old is not None and k not in gone:
            pods.append(old)
    policies = {m["metadata"]["name"]: m for m in before.policies}
    for name in POLICY_NAMES:
        what = draw(st.sampled_from(("keep", "keep", "keep", "change", "remove")))
        if what == "change":
            policies[name] = draw(st.one_of(manifests(name), focused(name)))
        elif what == "remove":
            policies.pop(name, None)
    namespaces = dict(before.namespaces)
    relabel = draw(st.sampled_from((None, None, *NAMESPACES)))
    if relabel is not None:
        namespaces[relabel] = draw(labels_of)
    return replace(
        before, pods=tuple(pods), policies=tuple(policies.values()), namespaces=namespaces
    )


@st.composite
def histories(draw: Any) -> list[Layout]:
    cluster = draw(clusters())
    layouts = []
    for step in range(STEPS):
        if step:
            cluster = draw(next_cluster(cluster))
        addresses = draw(st.lists(st.sampled_from(NODE_ADDRESSES), unique=True, max_size=3))
        layouts.append(calc_layout(inputs_of(cluster), NODE, addresses))
    return layouts


@settings(
    max_examples=HISTORIES,
    deadline=None,
    database=None,
    print_blob=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(layouts=histories())
def test_diffs_step_by_step_hold_what_full_renders_hold(
    tables: tuple[Apply, Apply], layouts: list[Layout]
) -> None:
    by_diff, whole = tables
    first = render_full(layouts[0])
    assert normalise(by_diff(first, True)) == normalise(whole(first, True))
    for old, new in zip(layouts, layouts[1:], strict=False):
        script = render_diff(old, new)
        assert "flush table" not in script and "flush set" not in script
        assert normalise(by_diff(script, False)) == normalise(whole(render_full(new), True)), (
            script
        )

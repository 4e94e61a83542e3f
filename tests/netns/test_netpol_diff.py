"""``render_diff`` (netpol/diff.py) brings the kernel where a full render does, in real netns.

Generated histories of clusters (tests/fixtures/netpol_cases.py: both families, named ports,
ipBlocks with excepts, Pods on this node or another) change step by step: Pods relabelled,
moved, removed and back, policies added, changed and removed, namespaces relabelled, the
node's addresses changed. One netns gets the first layout whole, then each step's diff
through one kept libnftables context (``kernel.nft.run_sized``, as pycnid sends it); a
second gets each step's layout whole in a table made afresh. pycnid's netns starts as pycnid's
first pass into a node without the table does (``diff.calc_first_render``: the script, then
the plain elements as one netlink batch). After each step both tables,
listed, must hold the same (set elements in any order, each chain's rules in order). Pod
addresses are adjacent, so peer intervals merge and split as Pods come and go.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from netpol.diff import calc_element_batch, render_diff
from netpol.evaluate import NamedPort, PodInfo, PolicyInputs
from netpol.policy import parse_policy
from netpol.render import Layout, calc_layout
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
from tests.fixtures.netpol_reference import Cluster, Pod
from tests.fixtures.scale import sized

pytestmark = [pytest.mark.netns, pytest.mark.long]
ROOT = Path(__file__).resolve().parents[2]
NODE = "n1"
POLICY_NAMES = ("p1", "p2", "p3", "p4")
NODE_ADDRESSES = ("192.168.0.1", "192.168.0.2", "192.168.0.3", "fd01::1", "fd01::2")
HISTORIES = sized(6, 60)
STEPS = sized(5, 12)
#: In the netns: one request a line, a pickled (how, old layout, new layout), one JSON answer a
#: line: the table's listing after it, or nft's error. ``how``: "sync" sends the diff as pycnid
#: does (a netlink batch when it is elements alone), "script" as nft's script always, "whole"
#: renders ``new`` whole into a table made afresh, "first" as pycnid's first pass into a node
#: without the table does (the script, then the plain elements as one batch).
SERVER = """
import base64, json, pickle, sys
from kernel.nft import Nft, NftError, run_sized
from netpol.diff import calc_element_batch, calc_first_render, render_diff
from netpol.render import T, render_full
from netpol.sync import send_first, send_update

nft = Nft()
for line in sys.stdin:
    how, old, new = pickle.loads(base64.b64decode(line))
    batch = None
    try:
        if how in ("whole", "first"):
            nft.run(f"add table {T}\\ndelete table {T}\\n")
            if how == "first":  # into a node without the table, as pycnid's first pass
                script, batch = calc_first_render(new)
                send_first(nft, script, batch)
            else:
                run_sized(nft, render_full(new))
        else:
            batch = calc_element_batch(old, new) if how == "sync" else None
            send_update(nft, render_diff(old, new), batch)
        answer = {"listing": nft.list_json(f"list table {T}"), "batch": batch is not None}
    except NftError as exc:
        answer = {"error": str(exc)}
    print(json.dumps(answer), flush=True)
"""
Apply = Callable[[str, Layout, Layout], dict[str, Any]]
HOWS = ("sync", "script", "whole")


@pytest.fixture(scope="module")
def tables() -> Iterator[dict[str, Apply]]:
    """A netns per way of sending, each with its nft server; all deleted after the module,
    whatever failed."""
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    made: list[tuple[Any, subprocess.Popen[str]]] = []
    try:
        for how in HOWS:
            ns = new_netns(f"np{how}")
            cmd = ["ip", "netns", "exec", ns.name, sys.executable, "-c", SERVER]
            server = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
            )
            made.append((ns, server))
        yield {how: applier(server) for how, (_ns, server) in zip(HOWS, made, strict=True)}
    finally:
        for ns, server in made:
            server.kill()
            server.communicate()  # waits, and closes its pipes
            ns.delete()


def applier(server: subprocess.Popen[str]) -> Apply:
    def apply(how: str, old: Layout, new: Layout) -> dict[str, Any]:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(base64.b64encode(pickle.dumps((how, old, new))).decode() + "\n")
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
    """One Pod relabelled (what pycnid sees most), or: a few Pods redrawn (labels, ports,
    families, node) or removed; each policy kept, redrawn (added when absent) or removed; a
    namespace relabelled; or all of these at once."""
    kind = draw(st.sampled_from(("relabel", "relabel", "pods", "policies", "namespace", "all")))
    if kind == "relabel" and before.pods:
        k = draw(st.integers(0, len(before.pods) - 1))
        pod = replace(before.pods[k], labels={**draw(labels_of), "pod": before.pods[k].name})
        return replace(before, pods=(*before.pods[:k], pod, *before.pods[k + 1 :]))
    pods = draw(next_pods(before)) if kind in ("pods", "all") else before.pods
    policies = draw(next_policies(before)) if kind in ("policies", "all") else before.policies
    namespaces = dict(before.namespaces)
    if kind in ("namespace", "all"):
        namespaces[draw(st.sampled_from(NAMESPACES))] = draw(labels_of)
    return replace(before, pods=pods, policies=policies, namespaces=namespaces)


@st.composite
def next_pods(draw: Any, before: Cluster) -> tuple[Pod, ...]:
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
    return tuple(pods)


@st.composite
def next_policies(draw: Any, before: Cluster) -> tuple[Mapping[str, Any], ...]:
    policies = {m["metadata"]["name"]: m for m in before.policies}
    for name in POLICY_NAMES:
        what = draw(st.sampled_from(("keep", "keep", "change", "remove")))
        if what == "change":
            policies[name] = draw(st.one_of(manifests(name), focused(name)))
        elif what == "remove":
            policies.pop(name, None)
    return tuple(policies.values())


@st.composite
def histories(draw: Any) -> list[Layout]:
    cluster = draw(clusters())
    if draw(st.booleans()):  # policies whose sets a relabel changes
        cluster = replace(cluster, policies=(draw(focused("p1")), draw(focused("p2"))))
    addresses = ["192.168.0.1"]
    layouts = []
    for step in range(STEPS):
        if step:
            cluster = draw(next_cluster(cluster))
        if draw(st.integers(0, 3)) == 0:  # now and then: the node's addresses
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
    tables: dict[str, Apply], layouts: list[Layout]
) -> None:
    listings = {  # pycnid's netns starts as its first pass does, the others whole
        how: normalise(apply("first" if how == "sync" else "whole", Layout(), layouts[0]))
        for how, apply in tables.items()
    }
    assert listings["sync"] == listings["script"] == listings["whole"]
    for old, new in zip(layouts, layouts[1:], strict=False):
        script = render_diff(old, new)
        assert "flush table" not in script and "flush set" not in script
        whole = normalise(tables["whole"]("whole", old, new))
        for how in ("sync", "script"):
            assert normalise(tables[how](how, old, new)) == whole, (how, script)


def test_a_pod_isolated_in_a_chain_the_kernel_holds_is_one_batch_with_its_counter(
    tables: dict[str, Apply],
) -> None:
    """b joins a's chain, then leaves it: its map entries and its drop counter come and go in
    one netlink batch each (no libnftables), and the table holds what a full render holds."""
    deny = parse_policy({**API, "metadata": {"namespace": "x", "name": "deny"},
                         "spec": {"podSelector": {"matchLabels": {"app": "db"}}}})  # fmt: skip
    a = PodInfo("x", "a", ("10.0.0.1", "fd00::1"), {"app": "db"}, NODE)
    b = PodInfo("x", "b", ("10.0.0.2",), {"app": "web"}, NODE)
    layouts = [
        calc_layout(PolicyInputs(pods, {}, (deny,)), NODE, ["192.168.0.1"])
        for pods in ((a, b), (a, replace(b, labels={"app": "db"})), (a, b))
    ]
    assert normalise(tables["sync"]("first", Layout(), layouts[0]))
    for old, new in zip(layouts, layouts[1:], strict=False):
        batch = calc_element_batch(old, new)
        assert batch is not None and [c.name for c in batch.counters] == ["dropped-in/x/b"]
        answer = tables["sync"]("sync", old, new)
        assert answer["batch"]
        assert normalise(answer) == normalise(tables["whole"]("whole", old, new))
    held = normalise(tables["sync"]("sync", layouts[0], layouts[1]))
    assert "counter dropped-in/x/b" in held["objects"]


def test_a_pod_leaving_a_chain_it_was_alone_in_is_one_batch_chain_and_sets_deleted(
    tables: dict[str, Apply],
) -> None:
    """b, the one Pod ``only-b`` isolates (from a's Pods, on a named port and an ipBlock: a
    chain, a peer set, an interval set and a named-port set of its own), is relabelled out of
    it: its entries, counter, chain and sets leave in one netlink batch, and the table holds
    what a full render holds; isolated again, the chain comes back through nft's script."""
    only_b = parse_policy({**API, "metadata": {"namespace": "x", "name": "only-b"}, "spec": {
        "podSelector": {"matchLabels": {"only": "b"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}},
                              {"ipBlock": {"cidr": "10.9.0.0/16", "except": ["10.9.1.0/24"]}}],
                     "ports": [{"port": "http"}]}]}})  # fmt: skip
    a = PodInfo("x", "a", ("10.0.0.1", "fd00::1"), {"app": "a"}, NODE)
    b = PodInfo("x", "b", ("10.0.0.2",), {"only": "b"}, NODE, (NamedPort("http", "TCP", 8080),))
    layouts = [
        calc_layout(PolicyInputs(pods, {}, (only_b,)), NODE, ["192.168.0.1"])
        for pods in ((a, b), (a, replace(b, labels={})), (a, b))
    ]
    assert layouts[0].chains and not layouts[1].chains
    gone = sorted(n.split("-")[0] for n in layouts[0].sets.keys() - layouts[1].sets.keys())
    assert gone == ["blocks4", "named4", "pods4"]
    assert normalise(tables["sync"]("first", Layout(), layouts[0]))
    for (old, new), batched in zip(
        zip(layouts, layouts[1:], strict=False), (True, False), strict=True
    ):
        batch = calc_element_batch(old, new)
        assert (batch is not None and bool(batch.removals)) == batched
        answer = tables["sync"]("sync", old, new)
        assert answer["batch"] == batched
        assert normalise(answer) == normalise(tables["whole"]("whole", old, new))

"""Assertions shared by the cluster tests: store invariants, `pycni ipam check`, leftovers."""

from __future__ import annotations

import ipaddress
import json

from tests.fixtures.cluster import Cluster

from .invariants import StoreView
from .load import NETWORK, Call, pycni_ipam_cli


def store_view(cluster: Cluster) -> StoreView:
    return StoreView.parse(cluster.etcd.dump())


def assert_store_consistent(view: StoreView) -> None:
    problems = view.problems()
    assert not problems, f"{len(problems)} store problem(s):\n" + "\n".join(problems[:20])


def assert_no_duplicates(calls: list[Call]) -> None:
    seen: dict[str, str] = {}
    dupes = []
    for call in calls:
        for ip in call.ips():
            if ip in seen:
                dupes.append(f"{ip}: {seen[ip]} and {call.node}/{call.cid}")
            seen[ip] = f"{call.node}/{call.cid}"
    assert not dupes, f"{len(dupes)} address(es) handed out twice:\n" + "\n".join(dupes[:20])


def assert_handles_match(view: StoreView, calls: list[Call], network: str = NETWORK) -> None:
    """The pod handles in the store are exactly the successful ADDs, with their addresses
    and the node that served them."""
    handles = view.pod_handles(network)
    expected = {f"{network}/{c.cid}/eth0": c for c in calls if c.ok}
    missing = sorted(set(expected) - set(handles))
    extra = sorted(set(handles) - set(expected))
    assert not missing, f"{len(missing)} successful ADD(s) have no handle: {missing[:10]}"
    assert not extra, f"{len(extra)} handle(s) from no successful ADD: {extra[:10]}"
    wrong = [
        f"{h}: store {handles[h]} vs ADD {c.ips()}"
        for h, c in expected.items()
        if sorted(handles[h]) != sorted(c.ips())
    ]
    assert not wrong, "handles disagree with the ADD results:\n" + "\n".join(wrong[:10])
    nodes = [
        f"{h}: {view.handles[h].get('attributes', {}).get('node')} != {c.node}"
        for h, c in expected.items()
        if view.handles[h].get("attributes", {}).get("node") != c.node
    ]
    assert not nodes, "handles name the wrong node:\n" + "\n".join(nodes[:10])


def assert_from_own_blocks(view: StoreView, network: str = NETWORK) -> None:
    """With free blocks left in the pool, every pod address comes from a block affine to the
    node that served it (no borrowing needed, so nodes write their own blocks only)."""
    affinity = {
        (rec["pool"], str(ipaddress.ip_network(rec["cidr"]))): rec.get("affinity")
        for rec in view.blocks.values()
    }
    foreign = []
    for holder in view.pod_handles(network):
        record = view.handles[holder]
        node = record.get("attributes", {}).get("node")
        for ip in record.get("ips") or []:
            owner = affinity.get((ip["pool"], str(ipaddress.ip_network(ip["block"]))))
            if owner != node:
                foreign.append(f"{holder} on {node}: {ip['address']} in a block of {owner}")
    assert not foreign, f"{len(foreign)} address(es) from another node's block: {foreign[:10]}"


def assert_only_buffers_left(view: StoreView, network: str = NETWORK) -> None:
    """No pod handle of ``network`` and no allocation held by anything but a node's outage
    buffer (`_buffer/<node>/<pool>`, a node-owned handle by design)."""
    assert view.pod_handles(network) == {}, "pod handles left after DEL of every attachment"
    held = {ip: h for ip, h in view.allocations().items() if not h.startswith("_buffer/")}
    assert not held, f"{len(held)} address(es) still allocated: {sorted(held.items())[:10]}"


def cli_check(cluster: Cluster, when: str) -> tuple[str, list]:
    """Run `pycni ipam check --output json` on a node now: (when, problems). A run that
    fails or prints no JSON report is a problem too."""
    out = pycni_ipam_cli(cluster.nodes[0], "check", "--output", "json")
    try:
        report = json.loads(out.stdout)
    except ValueError:
        return when, [f"exit {out.returncode}, not JSON: {out.stdout}{out.stderr}"]
    problems = report.get("problems") if isinstance(report, dict) else report
    if out.returncode != 0 and not problems:
        problems = [f"exit {out.returncode}: {out.stderr}"]
    return when, list(problems or [])


def assert_cli_checks_clean(results: list[tuple[str, list]]) -> None:
    """Every `pycni ipam check` taken during the test was clean (checked last, so a dirty
    report never hides what the test's own store checks found)."""
    dirty = [(when, problems) for when, problems in results if problems]
    assert not dirty, f"pycni ipam check reports problems: {dirty}"

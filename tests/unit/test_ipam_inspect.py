"""`pycni ipam show` and `check`, pure: hand-made store contents in, precise reports out."""

from __future__ import annotations

import json

import pytest

from ipam.ops.check import Fix, find_problems
from ipam.ops.inspect import parse_snapshot
from ipam.ops.show import report_handle, report_ip, report_overview
from store.base import KV
from tests.fixtures.ipam_contents import Contents, affinity_key, block_key

NOW = 1_700_000_000.0


def snap_of(contents: Contents, extra: list[KV] = ()):
    return parse_snapshot([*contents.kvs(), *extra], revision=42)


def kinds(contents: Contents, extra: list[KV] = ()) -> list[tuple[str, str | None]]:
    return [(f.kind, f.ip) for f in find_problems(snap_of(contents, extra))]


@pytest.fixture
def cluster() -> Contents:
    """Pool p (10.1.0.0/24, /26 blocks, gateway first) used by two nodes, and p6."""
    c = Contents(now=NOW).pool("p", "10.1.0.0/24", gateway="first", reuse_delay=60)
    c.pool("p6", "fd00:1::/120", block_size=122)
    c.allocate("p", "10.1.0.2", "net/c1/eth0", node="node1")
    c.allocate("p", "10.1.0.3", "net/c2/eth0", node="node1")
    c.allocate("p", "10.1.0.65", "net/c3/eth0", node="node2")
    c.allocate("p6", "fd00:1::2", "net/c1/eth0", node="node1")
    return c


def test_consistent_contents_have_no_problem(cluster):
    assert find_problems(snap_of(cluster)) == []


def test_pool_usage_counts_used_cooling_borrowed_free(cluster):
    cluster.allocate("p", "10.1.0.4", "net/c4/eth0", node="node2", block_node="node1")
    cluster.release("p", "10.1.0.10", at=NOW - 30)  # within the 60 s reuse delay
    cluster.release("p", "10.1.0.11", at=NOW - 90)  # past it: free again
    doc = report_overview(snap_of(cluster.heartbeat("node1")), now=NOW)
    p = next(x for x in doc["pools"] if x["name"] == "p")
    # 256 - network - broadcast - 4 block gateways
    assert (p["size"], p["reserved"]) == (250, 6)
    assert (p["used"], p["cooling"], p["borrowed"], p["free"], p["blocks"]) == (4, 1, 1, 245, 2)
    blocks = {(b["pool"], b["cidr"]): b for b in doc["blocks"]}
    first = blocks[("p", "10.1.0.0/26")]
    assert (
        first["node"],
        first["capacity"],
        first["used"],
        first["cooling"],
        first["borrowed"],
        first["free"],
    ) == ("node1", 62, 3, 1, 1, 58)
    assert blocks[("p", "10.1.0.64/26")]["capacity"] == 63
    nodes = {n["name"]: n for n in doc["nodes"]}
    assert nodes["node1"]["alive"] and not nodes["node2"]["alive"]
    assert nodes["node1"]["blocks"] == ["p:10.1.0.0/26", "p6:fd00:1::/122"]
    assert (nodes["node1"]["used"], nodes["node2"]["used"]) == (4, 1)
    assert doc["revision"] == 42
    json.dumps(doc)  # JSON-ready as it is


def test_block_marked_borrowed_counts_as_borrowed(cluster):
    cluster.records[block_key("p", "10.1.0.64/26")]["borrowed"] = {"10.1.0.65": "node1"}
    cluster.records["/pycni/v1/handles/net/c3/eth0"]["attributes"]["node"] = "node2"
    doc = report_overview(snap_of(cluster), now=NOW)
    assert next(x for x in doc["pools"] if x["name"] == "p")["borrowed"] == 1


def test_duplicate_address_keeps_the_holder_the_block_names(cluster):
    cluster.list_in_handle("net/c9/eth0", "p", "10.1.0.2", node="node2")
    (finding,) = find_problems(snap_of(cluster))
    assert finding.kind == "duplicate-address" and finding.ip == "10.1.0.2"
    assert finding.handles == ("net/c1/eth0", "net/c9/eth0")
    assert "the block gives it to net/c1/eth0" in finding.message
    assert finding.fixes == (
        Fix(
            "drop",
            ip="10.1.0.2",
            handle="net/c9/eth0",
            pool="p",
            block_key=block_key("p", "10.1.0.0/26"),
        ),
    )


def test_duplicate_that_no_block_names_is_left_to_an_operator(cluster):
    cluster.list_in_handle("net/c8/eth0", "p", "10.1.0.20")
    cluster.list_in_handle("net/c9/eth0", "p", "10.1.0.20")
    (finding,) = find_problems(snap_of(cluster))
    assert finding.kind == "duplicate-address" and finding.fixes == ()
    assert "fix by hand" in finding.message


def test_netconf_pools_of_two_networks_may_share_a_subnet():
    c = Contents(now=NOW)
    a = c.netconf_pool("neta", "10.9.0.0/24")
    b = c.netconf_pool("netb", "10.9.0.0/24")
    c.allocate(a, "10.9.0.2", "neta/c1/eth0").allocate(b, "10.9.0.2", "netb/c2/eth0")
    assert find_problems(snap_of(c)) == []
    doc = report_ip(snap_of(c), "10.9.0.2", now=NOW)
    assert [(m["pool"], m["handle"]) for m in doc["matches"]] == [
        (a, "neta/c1/eth0"),
        (b, "netb/c2/eth0"),
    ]


def test_orphan_allocation_is_freed(cluster):
    cluster.block("p", "10.1.0.0/26", "node1")["allocations"]["10.1.0.30"] = "net/gone/eth0"
    (finding,) = find_problems(snap_of(cluster))
    assert (finding.kind, finding.ip, finding.handles) == (
        "orphan-allocation",
        "10.1.0.30",
        ("net/gone/eth0",),
    )
    assert "which is missing" in finding.message
    assert finding.fixes == (
        Fix(
            "free", ip="10.1.0.30", holder="net/gone/eth0", block_key=block_key("p", "10.1.0.0/26")
        ),
    )


def test_allocation_for_a_handle_that_does_not_list_it_is_orphan(cluster):
    cluster.block("p", "10.1.0.0/26", "node1")["allocations"]["10.1.0.31"] = "net/c1/eth0"
    (finding,) = find_problems(snap_of(cluster))
    assert finding.kind == "orphan-allocation" and "does not list it" in finding.message


def test_handle_address_the_block_does_not_hold_is_restored(cluster):
    cluster.list_in_handle("net/c1/eth0", "p", "10.1.0.40")
    (finding,) = find_problems(snap_of(cluster))
    assert (finding.kind, finding.ip) == ("not-allocated", "10.1.0.40")
    assert finding.fixes[0].action == "restore" and finding.fixes[0].handle == "net/c1/eth0"


def test_handle_address_whose_block_is_gone(cluster):
    cluster.list_in_handle("net/c7/eth0", "p", "10.1.0.200", node="node3")
    (finding,) = find_problems(snap_of(cluster))
    assert finding.kind == "missing-block"
    # restored into a block claimed for the handle's node
    assert finding.fixes == (
        Fix(
            "restore",
            ip="10.1.0.200",
            handle="net/c7/eth0",
            pool="p",
            cidr="10.1.0.192/26",
            node="node3",
            block_key=block_key("p", "10.1.0.192/26"),
        ),
    )


def test_wrong_holder_is_repointed(cluster):
    cluster.records[block_key("p", "10.1.0.0/26")]["allocations"]["10.1.0.2"] = "net/zz/eth0"
    (finding,) = find_problems(snap_of(cluster))
    assert finding.kind == "wrong-holder" and finding.handles == ("net/c1/eth0", "net/zz/eth0")
    assert finding.fixes[0].action == "repoint"


def test_block_of_missing_pool_and_handle_of_missing_pool(cluster):
    del cluster.records["/pycni/v1/pools/p6"]
    got = kinds(cluster)
    # c1 still holds 10.1.0.2 of pool p: only its p6 address is dropped
    assert ("orphan-block", None) in got and ("missing-pool", "fd00:1::2") in got
    c = Contents(now=NOW).pool("p", "10.1.0.0/24").pool("q", "10.2.0.0/24")
    c.allocate("q", "10.2.0.5", "net/only/eth0")
    del c.records["/pycni/v1/pools/q"]
    findings = find_problems(snap_of(c))
    assert [(f.kind, [x.action for x in f.fixes]) for f in findings] == [
        ("orphan-block", []),
        ("orphan-handle", ["delete-handle"]),
    ]
    assert "holds 1 address(es)" in findings[0].message


def test_empty_orphan_block_is_deleted_with_its_index():
    c = Contents(now=NOW).pool("p", "10.1.0.0/24")
    c.block("gone", "10.7.0.0/26", "node1")
    (finding,) = find_problems(snap_of(c))
    assert finding.kind == "orphan-block"
    assert finding.fixes == (
        Fix("delete-block", block_key=block_key("gone", "10.7.0.0/26"), node="node1"),
    )


def test_handle_without_address_is_orphan_but_an_empty_buffer_is_not(cluster):
    cluster.records["/pycni/v1/handles/net/empty/eth0"] = {
        "network": "net",
        "containerID": "empty",
        "ifname": "eth0",
        "ips": [],
        "attributes": {"node": "node1"},
    }
    cluster.records["/pycni/v1/handles/_buffer/node1/p"] = {
        "network": "_buffer",
        "containerID": "node1",
        "ifname": "p",
        "ips": [],
        "attributes": {"node": "node1"},
    }
    assert kinds(cluster) == [("orphan-handle", None)]


def test_affinity_index_is_checked_both_ways(cluster):
    del cluster.records[affinity_key("node2", "p", "10.1.0.64/26")]
    cluster.records[affinity_key("node3", "p", "10.1.0.128/26")] = {"pool": "p"}
    cluster.records[affinity_key("node3", "p", "10.1.0.0/26")] = {"pool": "p"}
    findings = find_problems(snap_of(cluster))
    assert [(f.kind, f.key) for f in findings] == [
        ("missing-affinity", block_key("p", "10.1.0.64/26")),
        ("stale-affinity", affinity_key("node3", "p", "10.1.0.0/26")),
        ("stale-affinity", affinity_key("node3", "p", "10.1.0.128/26")),
    ]
    assert "is node node1's" in findings[1].message and "is gone" in findings[2].message


def test_corrupt_and_unusable_records_are_reported_not_raised(cluster):
    cluster.records["/pycni/v1/pools/broken"] = {"name": "broken", "cidr": "nonsense"}
    cluster.block("p", "10.1.0.128/26", "node1")["allocations"] = "not a map"
    extra = [KV("/pycni/v1/handles/net/junk/eth0", b"{not json", 7)]
    got = kinds(cluster, extra)
    assert ("corrupt-record", None) in got and ("bad-pool", None) in got
    assert sum(1 for k, _ in got if k == "corrupt-record") == 2


def test_block_that_does_not_fit_its_pool(cluster):
    cluster.block("p", "10.1.1.0/26", "node1")
    cluster.block("p", "10.1.0.128/27", "node1")
    assert kinds(cluster) == [("bad-block", None), ("bad-block", None)]


def test_show_ip_states(cluster):
    cluster.release("p", "10.1.0.10", at=NOW - 30)
    snap = snap_of(cluster)
    held = report_ip(snap, "10.1.0.2", now=NOW)["matches"][0]
    assert {
        k: held[k]
        for k in (
            "pool",
            "block",
            "state",
            "handle",
            "node",
            "namespace",
            "pod",
            "blockNode",
            "borrowed",
            "handleExists",
        )
    } == {
        "pool": "p",
        "block": "10.1.0.0/26",
        "state": "allocated",
        "handle": "net/c1/eth0",
        "node": "node1",
        "namespace": "default",
        "pod": "c1",
        "blockNode": "node1",
        "borrowed": False,
        "handleExists": True,
    }
    cooling = report_ip(snap, "10.1.0.10", now=NOW)["matches"][0]
    assert cooling["state"] == "cooling" and cooling["coolingUntil"] == NOW + 30
    assert report_ip(snap, "10.1.0.10", now=NOW + 31)["matches"][0]["state"] == "free"
    gateway = report_ip(snap, "10.1.0.64", now=NOW)["matches"][0]
    assert (gateway["state"], gateway["reason"]) == (
        "reserved",
        "the gateway of block 10.1.0.64/26",
    )
    unclaimed = report_ip(snap, "10.1.0.200", now=NOW)["matches"][0]
    assert (unclaimed["state"], unclaimed["blockClaimed"]) == ("free", False)
    assert report_ip(snap, "192.0.2.1", now=NOW)["matches"] == []


def test_show_handle_by_full_id_prefix_or_container_id(cluster):
    snap = snap_of(cluster)
    doc = report_handle(snap, "net/c1/eth0")
    (h,) = doc["handles"]
    assert (h["network"], h["containerID"], h["ifname"], h["node"]) == (
        "net",
        "c1",
        "eth0",
        "node1",
    )
    assert [(i["address"], i["pool"], i["inBlock"]) for i in h["ips"]] == [
        ("10.1.0.2/24", "p", True),
        ("fd00:1::2/120", "p6", True),
    ]
    assert [x["handle"] for x in report_handle(snap, "net/c1")["handles"]] == ["net/c1/eth0"]
    assert [x["handle"] for x in report_handle(snap, "c3")["handles"]] == ["net/c3/eth0"]
    assert report_handle(snap, "net")["handles"] == []
    assert len(report_handle(snap, "/pycni/v1/handles/net/c2/eth0")["handles"]) == 1

"""`pycni ipam` over what the real allocator writes: pools made by the CLI, addresses leased by
three nodes' lease services (claims, borrowing, dual-stack), then show/check/release/
release-node/pool rm on SQLite and on a real etcd — the reports must agree with the leases."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli import cli
from ipam.alloc.selection import Selection
from ipam.leases.service import LeaseService
from ipam.records import HandleId


@pytest.fixture
def ipam(store_args):
    runner = CliRunner()

    def run(*args: str, code: int = 0):
        result = runner.invoke(
            cli, ["ipam", *args, *store_args, "-o", "json"], catch_exceptions=False
        )
        assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
        return json.loads(result.stdout) if result.stdout.strip() else result

    return run


def h(cid: str) -> HandleId:
    return HandleId("net", cid, "eth0")


POOLS = Selection("net", pools=("tiny", "v6"))


@pytest.fixture
def leased(ipam, store):
    """tiny: 10.66.0.0/27 in two /28 blocks (gateway first: 14 addresses each) and v6;
    node1 and node2 take 3 dual-stack leases each, node3 then borrows an IPv4 address."""
    ipam(
        "pool", "add", "tiny", "--cidr", "10.66.0.0/27", "--block-size", "28", "--gateway", "first"
    )
    ipam("pool", "add", "v6", "--cidr", "fd66::/120", "--block-size", "122")
    nodes = {n: LeaseService(store, n) for n in ("node1", "node2", "node3")}
    records = {}
    for name in ("node1", "node2"):
        for i in range(3):
            records[f"{name}-{i}"] = nodes[name].acquire(
                h(f"{name}-{i}"), POOLS, attributes={"namespace": "ns", "pod": f"{name}-{i}"}
            )[0]
    records["node3-0"] = nodes["node3"].acquire(h("node3-0"), POOLS)[0]
    return nodes, records


def test_reports_agree_with_the_leases(ipam, leased):
    nodes, records = leased
    assert ipam("check")["ok"] is True
    overview = ipam("show")
    pools = {p["name"]: p for p in overview["pools"]}
    # /27 minus network, broadcast and two block gateways
    assert (pools["tiny"]["size"], pools["tiny"]["used"], pools["tiny"]["borrowed"]) == (28, 7, 1)
    assert pools["tiny"]["free"] == 21 and (pools["v6"]["used"], pools["v6"]["borrowed"]) == (7, 0)
    per_node = {n["name"]: n for n in overview["nodes"]}
    assert sorted(per_node) == ["node1", "node2", "node3"]
    assert len(per_node["node3"]["blocks"]) == 1  # its own v6 block; its v4 is borrowed
    assert [(per_node[n]["handles"], per_node[n]["addresses"]) for n in sorted(per_node)] == [
        (3, 6),
        (3, 6),
        (1, 2),
    ]
    v4 = records["node3-0"].ips[0]
    (match,) = ipam("show", v4.ip)["matches"]
    assert (match["state"], match["handle"], match["node"], match["borrowed"]) == (
        "allocated",
        "net/node3-0/eth0",
        "node3",
        True,
    )
    assert match["blockNode"] == records["node3-0"].attributes["borrowedFrom"]
    gateway = records["node1-0"].ips[0].gateway
    assert ipam("show", gateway)["matches"][0]["state"] == "reserved"
    shown = ipam("show", "net/node1-0/eth0")["handles"][0]
    assert [i["address"] for i in shown["ips"]] == [ip.address for ip in records["node1-0"].ips]
    assert shown["attributes"] == {"namespace": "ns", "pod": "node1-0", "node": "node1"}


def test_release_ip_then_the_node_deletes_the_rest(ipam, leased, store):
    nodes, records = leased
    v4, v6 = records["node1-0"].ips
    assert ipam("release", v4.ip)["handles"] == ["net/node1-0/eth0"]
    assert ipam("check")["ok"] is True
    assert [i["address"] for i in ipam("show", "net/node1-0")["handles"][0]["ips"]] == [v6.address]
    assert ipam("show", v4.ip)["matches"][0]["state"] == "cooling"
    assert [ip.ip for ip in nodes["node1"].release(h("node1-0")).ips] == [v6.ip]  # CNI DEL
    assert ipam("show", "node1-0", code=1).exit_code == 1
    again = nodes["node1"].acquire(h("node1-9"), POOLS)[0]  # the node's cache copes
    assert again.ips[0].ip != v4.ip  # still cooling: not handed out again yet
    assert ipam("check")["ok"] is True


def test_pool_rm_waits_for_release_node_and_dels(ipam, leased):
    nodes, _ = leased
    assert "still has addresses in use" in ipam("pool", "rm", "tiny", code=1).stderr
    report = ipam("release-node", "node2")  # no heartbeat: node2 counts as gone
    assert report["complete"] is True and len(report["released"]) == 3
    assert ipam("check")["ok"] is True
    (gone,) = [n for n in ipam("show")["nodes"] if n["name"] == "node2"]
    assert (gone["handles"], gone["addresses"]) == (0, 0)  # node3 may still borrow in its block
    for name, count in (("node1", 3), ("node3", 1)):
        for i in range(count):
            assert nodes[name].release(h(f"{name}-{i}")) is not None
    assert ipam("pool", "rm", "tiny")["removed"] is True
    assert ipam("pool", "rm", "v6")["removed"] is True
    overview = ipam("show")
    assert overview["pools"] == [] and overview["blocks"] == []
    assert ipam("check") == {**ipam("check"), "ok": True, "problems": []}
    assert ipam("check")["counts"] == {"pools": 0, "blocks": 0, "handles": 0, "allocations": 0}

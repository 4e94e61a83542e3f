"""`pycni ipam` through click's CliRunner, on SQLite and on a real etcd: JSON shapes, pool
round trip, check finding injected damage and gc repairing it, release, errors."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from cli import cli
from tests.fixtures.ipam_contents import Contents, block_key

P = "/pycni/v1/"


@pytest.fixture
def ipam(store_args):
    """``ipam(*args, code=0)``: run `pycni ipam ARGS` on the test's store; JSON when -o json."""
    runner = CliRunner()

    def run(*args: str, code: int = 0):
        result = runner.invoke(cli, ["ipam", *args, *store_args], catch_exceptions=False)
        assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        if "json" in args and result.stdout.strip():
            return json.loads(result.stdout)
        return result

    return run


def test_pool_round_trip_in_json(ipam):
    added = ipam(
        "pool",
        "add",
        "v4",
        "--cidr",
        "10.60.0.0/16",
        "--block-size",
        "24",
        "--node-selector",
        "zone=a",
        "--exclude",
        "10.60.0.0/30",
        "--gateway",
        "first",
        "--reuse-delay",
        "30",
        "--strict-affinity",
        "-o",
        "json",
    )
    assert set(added) == {"pool"}
    assert {k: v for k, v in added["pool"].items() if k != "createdAt"} == {
        "name": "v4",
        "cidr": "10.60.0.0/16",
        "blockSize": 24,
        "disabled": False,
        "nodeSelector": {"zone": "a"},
        "strictAffinity": True,
        "exclusions": ["10.60.0.0/30"],
        "gateway": "first",
        "reuseDelay": 30,
    }
    assert abs(added["pool"]["createdAt"] - time.time()) < 60
    ipam("pool", "add", "v6", "--cidr", "fd00:60::/64", "--disabled")
    listed = ipam("pool", "ls", "-o", "json")
    assert [(p["name"], p["cidr"], p["source"], p["disabled"]) for p in listed["pools"]] == [
        ("v4", "10.60.0.0/16", "cluster", False),
        ("v6", "fd00:60::/64", "cluster", True),
    ]
    changed = ipam("pool", "set", "v6", "--enabled", "--exclude", "fd00:60::1", "-o", "json")
    assert set(changed) == {"pool", "previous", "changed", "warnings"}
    assert changed["changed"] == ["disabled", "exclusions"]
    assert changed["pool"]["exclusions"] == ["fd00:60::1/128"]
    assert changed["previous"]["disabled"] is True and changed["warnings"] == []
    removed = ipam("pool", "rm", "v6", "-o", "json")
    assert removed == {"pool": "v6", "removed": True, "releasedAddresses": 0, "deletedBlocks": 0}
    assert [p["name"] for p in ipam("pool", "ls", "-o", "json")["pools"]] == ["v4"]


def test_pool_table_output_is_aligned(ipam):
    ipam("pool", "add", "a", "--cidr", "10.60.0.0/16")
    ipam("pool", "add", "longer-name", "--cidr", "fd00:60::/64", "--node-selector", "zone=b")
    lines = ipam("pool", "ls").stdout.splitlines()
    assert lines[0].split() == [
        "NAME",
        "CIDR",
        "BLOCK",
        "SOURCE",
        "DISABLED",
        "STRICT",
        "GATEWAY",
        "REUSE",
        "SELECTOR",
        "EXCLUSIONS",
        "ERROR",
    ]
    assert [line.index("/") for line in lines[1:]] == [
        lines[0].index("CIDR") + 9,
        lines[0].index("CIDR") + 9,
    ]
    assert lines[2].split()[:3] == ["longer-name", "fd00:60::/64", "/122"]


def test_pool_errors_are_one_line_and_exit_1(ipam):
    ipam("pool", "add", "a", "--cidr", "10.60.0.0/16")
    cases = [
        (("pool", "add", "b", "--cidr", "10.60.1.0/24"), "overlaps pool a (10.60.0.0/16)"),
        (
            ("pool", "add", "c", "--cidr", "10.61.0.0/16", "--block-size", "18"),
            "IPv4 blocks are /20 to /32",
        ),
        (("pool", "add", "c", "--cidr", "10.61.0.1/16"), "host bits set"),
        (
            ("pool", "add", "c", "--cidr", "10.61.0.0/16", "--exclude", "10.62.0.0/24"),
            "not inside pool",
        ),
        (
            ("pool", "add", "c", "--cidr", "10.61.0.0/16", "--node-selector", "zone"),
            "expected label=value",
        ),
        (("pool", "set", "a", "--cidr", "10.60.0.0/17"), "cidr of pool a is immutable"),
        (("pool", "set", "a", "--block-size", "28"), "blockSize of pool a is immutable"),
        (("pool", "set", "a"), "nothing to change for pool a"),
        (("pool", "set", "nope", "--disabled"), "pool nope does not exist"),
        (("pool", "rm", "nope"), "pool nope does not exist"),
        (("show", "net/none"), "no handle matches net/none"),
    ]
    for args, message in cases:
        result = ipam(*args, code=1)
        assert result.stderr.startswith("pycni ipam: ") and message in result.stderr, args
        assert result.stdout == ""


def test_show_reports_in_json(ipam, store):
    ipam("pool", "add", "p", "--cidr", "10.1.0.0/24", "--gateway", "first")
    c = Contents(records={f"{P}pools/p": json.loads(store.get(f"{P}pools/p").value)})
    c.allocate("p", "10.1.0.2", "net/c1/eth0", pod="web-1").write(store)
    overview = ipam("show", "-o", "json")
    assert set(overview) == {"revision", "pools", "blocks", "nodes"}
    (pool,) = overview["pools"]
    assert {
        k: pool[k]
        for k in ("name", "size", "reserved", "used", "free", "cooling", "borrowed", "blocks")
    } == {
        "name": "p",
        "size": 250,
        "reserved": 6,
        "used": 1,
        "free": 249,
        "cooling": 0,
        "borrowed": 0,
        "blocks": 1,
    }
    assert overview["blocks"] == [
        {
            "pool": "p",
            "cidr": "10.1.0.0/26",
            "node": "node1",
            "capacity": 62,
            "used": 1,
            "free": 61,
            "cooling": 0,
            "borrowed": 0,
            "emptySince": None,
        }
    ]
    assert overview["nodes"] == [
        {
            "name": "node1",
            "alive": False,
            "registered": False,
            "blocks": ["p:10.1.0.0/26"],
            "used": 1,
            "handles": 1,
            "addresses": 1,
        }
    ]
    held = ipam("show", "10.1.0.2", "-o", "json")
    assert held["ip"] == "10.1.0.2" and held["listedByHandles"] == ["net/c1/eth0"]
    assert (held["matches"][0]["state"], held["matches"][0]["pod"]) == ("allocated", "web-1")
    assert ipam("show", "10.1.0.1", "-o", "json")["matches"][0]["state"] == "reserved"
    handle = ipam("show", "net/c1/eth0", "-o", "json")
    assert [h["handle"] for h in handle["handles"]] == ["net/c1/eth0"]
    assert handle["handles"][0]["ips"][0]["inBlock"] is True
    text = ipam("show", "10.1.0.2").stdout
    assert "allocated to handle net/c1/eth0, pod default/web-1, node node1" in text
    assert "BLOCKS" in ipam("show").stdout


def test_check_finds_injected_damage_and_gc_repairs_it(ipam, store, store_kind):
    ipam("pool", "add", "p", "--cidr", "10.1.0.0/24")
    c = Contents(records={f"{P}pools/p": json.loads(store.get(f"{P}pools/p").value)})
    c.allocate("p", "10.1.0.2", "net/c1/eth0").allocate("p", "10.1.0.3", "net/c2/eth0")
    c.write(store)
    clean = ipam("check", "-o", "json")
    assert clean["ok"] is True and clean["problems"] == []
    assert clean["counts"] == {"pools": 1, "blocks": 1, "handles": 2, "allocations": 2}
    assert ipam("check").stdout.startswith("OK: no problems in 1 pools, 1 blocks")
    c.list_in_handle("net/dup/eth0", "p", "10.1.0.2", node="node2")  # duplicate
    c.block("p", "10.1.0.0/26", "node1")["allocations"]["10.1.0.9"] = "net/gone/eth0"
    c.write(store)
    report = ipam("check", "-o", "json", code=2)
    assert report["ok"] is False
    assert [(p["kind"], p["ip"], p["handles"]) for p in report["problems"]] == [
        ("duplicate-address", "10.1.0.2", ["net/c1/eth0", "net/dup/eth0"]),
        ("orphan-allocation", "10.1.0.9", ["net/gone/eth0"]),
    ]
    assert report["problems"][1]["fixes"] == [
        {
            "action": "free",
            "ip": "10.1.0.9",
            "holder": "net/gone/eth0",
            "block_key": block_key("p", "10.1.0.0/26"),
        }
    ]
    assert "duplicate-address" in ipam("check", code=2).stdout
    planned = ipam("gc", "--dry-run", "-o", "json")
    assert [(f["action"], f["status"]) for f in planned["fixes"]] == [
        ("drop", "planned"),
        ("free", "planned"),
    ]
    assert planned["dryRun"] is True and set(planned["reaper"]) >= {"summary"}
    assert len(ipam("check", "-o", "json", code=2)["problems"]) == 2  # dry run wrote nothing
    done = ipam("gc", "-o", "json")
    assert [(f["kind"], f["action"], f["status"]) for f in done["fixes"]] == [
        ("duplicate-address", "drop", "applied"),
        ("orphan-allocation", "free", "applied"),
    ]
    assert done["remaining"] == []
    assert ipam("check", "-o", "json")["ok"] is True
    if store_kind == "sqlite":  # no heartbeats: every node would look dead
        assert (
            done["reaper"]["available"] is False
            and "keeps no node heartbeats" in done["reaper"]["summary"]
        )
    else:  # etcd: node1 (it has a block) has no heartbeat, a first look makes it a suspect;
        # node2 is only named by a handle's attribute (no node record, no block), and the
        # reaper's candidates are the nodes the store lists by key (records, blocks, suspicions)
        assert done["reaper"]["available"] is True and done["reaper"]["grace"] == 900
        assert {(n["node"], n["state"]) for n in done["reaper"]["nodes"]} == {("node1", "suspect")}
    block = json.loads(store.get(block_key("p", "10.1.0.0/26")).value)
    assert block["allocations"] == {"10.1.0.2": "net/c1/eth0", "10.1.0.3": "net/c2/eth0"}


def test_gc_exits_2_when_problems_need_an_operator(ipam, store):
    ipam("pool", "add", "p", "--cidr", "10.1.0.0/24")
    c = Contents(records={f"{P}pools/p": json.loads(store.get(f"{P}pools/p").value)})
    c.list_in_handle("net/a/eth0", "p", "10.1.0.5").list_in_handle("net/b/eth0", "p", "10.1.0.5")
    c.write(store)
    doc = ipam("gc", "-o", "json", code=2)
    assert [p["kind"] for p in doc["remaining"]] == ["duplicate-address"]
    assert "left for an operator: duplicate-address" in ipam("gc", code=2).stdout


def test_release_ip(ipam, store):
    ipam("pool", "add", "p", "--cidr", "10.1.0.0/24")
    c = Contents(records={f"{P}pools/p": json.loads(store.get(f"{P}pools/p").value)})
    c.allocate("p", "10.1.0.2", "net/c1/eth0").write(store)
    doc = ipam("release", "10.1.0.2", "-o", "json")
    assert doc["released"] is True and doc["deletedHandles"] == ["net/c1/eth0"]
    assert store.get(f"{P}handles/net/c1/eth0") is None
    assert ipam("show", "10.1.0.2", "-o", "json")["matches"][0]["state"] == "cooling"
    again = ipam("release", "10.1.0.2")
    assert "nothing released" in again.stdout
    assert "invalid address 'nonsense'" in ipam("release", "nonsense", code=1).stderr


def test_gc_reaps_a_dead_node_on_a_second_look(ipam, store, store_kind):
    if store_kind == "sqlite":
        pytest.skip("the reaper needs heartbeats (etcd)")
    ipam("pool", "add", "p", "--cidr", "10.1.0.0/24")
    c = Contents(records={f"{P}pools/p": json.loads(store.get(f"{P}pools/p").value)})
    c.allocate("p", "10.1.0.2", "net/alive/eth0", node="node1").heartbeat("node1")
    c.allocate("p", "10.1.0.70", "net/dead/eth0", node="node2")
    c.write(store)
    first = ipam("gc", "--grace", "0", "-o", "json")
    assert {(n["node"], n["state"]) for n in first["reaper"]["nodes"]} == {
        ("node1", "alive"),
        ("node2", "suspect"),
    }
    assert store.get(f"{P}handles/net/dead/eth0") is not None  # one look is not enough
    planned = ipam("gc", "--grace", "0", "--dry-run", "-o", "json")
    assert ("node2", "reaped") in {(n["node"], n["state"]) for n in planned["reaper"]["nodes"]}
    assert store.get(f"{P}handles/net/dead/eth0") is not None  # a dry run writes nothing
    second = ipam("gc", "--grace", "0", "-o", "json")
    assert ("node2", "reaped") in {(n["node"], n["state"]) for n in second["reaper"]["nodes"]}
    assert store.get(f"{P}handles/net/dead/eth0") is None
    assert store.get(f"{P}handles/net/alive/eth0") is not None
    assert ipam("check", "-o", "json")["ok"] is True
    assert (
        ipam("gc", "--grace", "0")
        .stdout.splitlines()[-1]
        .startswith("dead-node reaper: 1 node(s) alive")
    )

"""`pycni node ls|show|rm` over what pycnid's own code writes: node records with an overlay
(write_node, and on etcd a live heartbeat kept by Liveness), blocks claimed and an address
borrowed by three nodes' lease services; on SQLite and on a real etcd."""

from __future__ import annotations

import json
import os
import sys

import pytest
from click.testing import CliRunner

from cli import cli
from ipam.alloc.selection import Selection
from ipam.leases.service import LeaseService
from ipam.records import HandleId
from nodes.liveness import Liveness, write_node
from nodes.record import NodeRecord, OverlayInfo, heartbeat_key, node_key
from store.base import Put
from store.keys import AFFINITY, HANDLES

POOLS = Selection("net", pools=("tiny",))
ROW_KEYS = {"name", "record", "address", "labels", "startedAt", "overlay", "blockCount", "health"}
HEALTH_KEYS = {"state", "heartbeat", "leaseTTL", "age", "suspectSince", "text"}
RM_KEYS = {
    "node",
    "dryRun",
    "force",
    "hadRecord",
    "release",
    "complete",
    "heartbeatDeleted",
    "forgotten",
    "summary",
}
VXLAN = OverlayInfo("vxlan", "192.168.77.1", "66:8a:11:22:33:01", ("10.66.0.1",), 1, 4789, 1450)
HOSTGW = OverlayInfo("host-gw", "127.0.0.1", mtu=1500)  # local wherever the test runs


@pytest.fixture
def node(store_args):
    runner = CliRunner()

    def run(*args: str, code: int = 0):
        result = runner.invoke(
            cli, ["node", *args, *store_args, "-o", "json"], catch_exceptions=False
        )
        assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
        return json.loads(result.stdout) if code == 0 else result

    return run


@pytest.fixture
def cluster(store, store_kind, store_args):
    """tiny 10.66.0.0/27 in /28 blocks: node1 (vxlan, alive on etcd) and node2 (host-gw) hold
    a block each; node3 (no overlay) borrows an address from one of them."""
    runner = CliRunner()
    added = runner.invoke(
        cli,
        [
            "ipam",
            "pool",
            "add",
            "tiny",
            "--cidr",
            "10.66.0.0/27",
            "--block-size",
            "28",
            "--reuse-delay",
            "0",
            *store_args,
        ],
    )
    assert added.exit_code == 0, added.stderr
    live = Liveness(store, NodeRecord("node1", "192.168.77.1", overlay=VXLAN), ttl=30).start()
    assert live.wait(10)
    write_node(store, NodeRecord("node2", "127.0.0.1", {"zone": "b"}, 1.7e9, HOSTGW))
    write_node(store, NodeRecord("node3", "192.168.77.3"))
    leases = {}
    for name in ("node1", "node2", "node3"):
        leases[name] = LeaseService(store, name).acquire(
            HandleId("net", f"c-{name}", "eth0"), POOLS
        )[0]
    yield live, leases
    live.stop()


def test_ls_lists_every_node_with_overlay_blocks_and_health(node, cluster, store_kind):
    rows = {row["name"]: row for row in node("ls")["nodes"]}
    assert sorted(rows) == ["node1", "node2", "node3"]
    assert all(set(row) == ROW_KEYS and set(row["health"]) == HEALTH_KEYS for row in rows.values())
    assert rows["node1"]["overlay"] == VXLAN.to_dict()
    assert rows["node2"]["overlay"]["backend"] == "host-gw" and rows["node3"]["overlay"] is None
    assert [rows[n]["blockCount"] for n in sorted(rows)] == [1, 1, 0]
    assert rows["node2"]["labels"] == {"zone": "b"} and rows["node2"]["startedAt"] == 1.7e9
    states = {n: rows[n]["health"]["state"] for n in rows}
    if store_kind == "sqlite":
        assert states == dict.fromkeys(rows, "unknown")
        assert rows["node1"]["health"]["text"] == "no heartbeat (SQLite)"
    else:
        assert states == {"node1": "alive", "node2": "dead", "node3": "dead"}
        assert 0 < rows["node1"]["health"]["leaseTTL"] <= 30
        assert rows["node1"]["health"]["text"].startswith("alive (lease ")


def test_ls_table_names_the_columns_and_each_node(store_args, cluster):
    out = CliRunner().invoke(cli, ["node", "ls", *store_args]).stdout.splitlines()
    assert out[0].split() == ["NAME", "UNDERLAY", "BACKEND", "VTEP", "MTU", "BLOCKS", "HEALTH"]
    assert out[1].split()[:6] == [
        "node1",
        "192.168.77.1",
        "vxlan",
        "66:8a:11:22:33:01",
        "10.66.0.1",
        "1450",
    ]
    assert [line.split()[0] for line in out[1:]] == ["node1", "node2", "node3"]


def test_show_gives_blocks_borrowed_addresses_and_host_gw_reachability(node, cluster):
    _, leases = cluster
    borrowed = leases["node3"].ips[0]
    shown = node("show", "node3")["node"]
    assert set(shown) == ROW_KEYS | {"blocks", "borrowed", "reachability"}
    assert shown["blocks"] == [] and shown["reachability"] is None
    assert shown["borrowed"] == [
        {
            "address": borrowed.ip,
            "pool": "tiny",
            "block": borrowed.block,
            "owner": leases["node3"].attributes["borrowedFrom"],
        }
    ]
    host_gw = node("show", "node2")["node"]
    assert host_gw["blocks"] == [{"pool": "tiny", "cidr": leases["node2"].ips[0].block}]
    assert host_gw["borrowed"] == [] and host_gw["reachability"] == "a local address of this node"
    assert node("show", "node1")["node"]["reachability"] is None  # vxlan: not a host-gw peer


def test_unknown_node_is_exit_1_naming_it(node, cluster):
    for verb in ("show", "rm"):
        result = node(verb, "ghost", code=1)
        assert result.stderr.startswith("pycni node: no node ghost"), result.stderr
        assert "Traceback" not in result.stderr


def test_a_corrupt_node_record_is_shown_not_fatal(node, store, cluster):
    store.txn([], [Put(node_key("node4"), b"{not json")])
    row = {r["name"]: r for r in node("ls")["nodes"]}["node4"]
    assert "corrupt" in row["error"] and row["overlay"] is None


def test_dry_run_writes_nothing(node, store, cluster):
    before = [(kv.key, kv.mod_revision) for kv in store.range("/pycni/v1/")]
    doc = node("rm", "node2", "--dry-run")
    assert set(doc) == RM_KEYS and doc["dryRun"] and not doc["forgotten"]
    assert doc["release"]["released"] == [
        {"handle": "net/c-node2/eth0", "ips": [cluster[1]["node2"].ips[0].ip]}
    ]
    assert [(kv.key, kv.mod_revision) for kv in store.range("/pycni/v1/")] == before


def test_rm_releases_what_the_reaper_would_and_forgets_the_node(node, store, cluster):
    doc = node("rm", "node3")
    assert (doc["complete"], doc["forgotten"], doc["heartbeatDeleted"]) == (True, True, False)
    assert [e["handle"] for e in doc["release"]["released"]] == ["net/c-node3/eth0"]
    assert store.get(node_key("node3")) is None
    assert not [kv for kv in store.range(HANDLES) if b"c-node3" in kv.key.encode()]
    assert [r["name"] for r in node("ls")["nodes"]] == ["node1", "node2"]
    doc = node("rm", "node2")  # its block holds nothing once its Pod's address is released
    assert doc["release"]["blocksReturned"] == [f"tiny/{cluster[1]['node2'].ips[0].block}"]
    assert not store.range(f"{AFFINITY}node2/")


@pytest.mark.etcd
@pytest.mark.parametrize("store_kind", ["etcd"])
def test_rm_is_refused_while_the_heartbeat_lives_unless_forced(node, store, cluster):
    refused = node("rm", "node1", code=1)
    assert heartbeat_key("node1") in refused.stderr and "alive" in refused.stderr
    assert store.get(node_key("node1")) is not None
    assert node("rm", "node1", "--dry-run", code=1).stderr == refused.stderr
    doc = node("rm", "node1", "--force")
    assert (doc["complete"], doc["forgotten"], doc["heartbeatDeleted"]) == (True, True, True)
    assert store.get(heartbeat_key("node1")) is None and store.get(node_key("node1")) is None
    assert [r["name"] for r in node("ls")["nodes"]] == ["node2", "node3"]


def test_show_from_a_node_namespace_reports_direct_or_the_gateway(netns_factory, sqlite_path):
    """The real command, run inside a namespace: a host-gw peer on its subnet is "direct", one
    behind its default route is named with the gateway."""
    from store.sqlite import SqliteStore

    ns = netns_factory("node")
    ns.run(
        "ip link add u0 type veth && ip addr add 192.168.88.1/24 dev u0 && "
        "ip link set u0 up && ip route add default via 192.168.88.254"
    )
    store = SqliteStore(sqlite_path)
    write_node(store, NodeRecord("near", overlay=OverlayInfo("host-gw", "192.168.88.2")))
    write_node(store, NodeRecord("far", overlay=OverlayInfo("host-gw", "10.99.0.2")))
    store.close()
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def show(name: str) -> dict:
        out = ns.run(
            [
                sys.executable,
                "-m",
                "cli",
                "node",
                "show",
                name,
                "--store-path",
                sqlite_path,
                "-o",
                "json",
            ],
            env={**os.environ, "PYTHONPATH": repo},
        )
        return json.loads(out.stdout)["node"]

    assert show("near")["reachability"] == "direct"
    assert (
        show("far")["reachability"] == "not directly connected: routed via gateway 192.168.88.254"
    )

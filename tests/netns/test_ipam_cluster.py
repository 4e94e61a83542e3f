"""The real pycni-ipam executable on cluster pools, against real pycnids in a node namespace:
pools by name (dual-stack, gateway "first"), pools chosen by the daemon's nodeLabels, precise
exhaustion, static requests, and two daemons (two nodes) on one store borrowing from each
other."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from ipam.records import BlockRecord
from store.keys import blocks_prefix
from tests.fixtures.daemon import Pycnid, daemon_config
from tests.fixtures.ipam import addresses, daemon_store, handles, ipam_conf, run_ipam
from tests.fixtures.ipam_pools import put_pool

pytestmark = pytest.mark.netns


@pytest.fixture
def daemons(node):
    """Start pycnids in the node namespace: ``start(name, store_path=None, **config)``."""
    started: list[tuple[Pycnid, str]] = []

    def start(name: str = "node1", store_path: str | None = None, **extra) -> Pycnid:
        workdir = tempfile.mkdtemp(prefix=f"pycnid-{name}-")
        store = {"type": "sqlite", "path": store_path} if store_path else None
        daemon = Pycnid(
            node=node,
            workdir=workdir,
            config=daemon_config(workdir, node_name=name, store=store, **extra),
        )
        started.append((daemon, workdir))
        return daemon.start()

    yield start
    for daemon, workdir in reversed(started):
        daemon.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def pod(netns_factory):
    return netns_factory("pod")


def cluster_conf(version: str = "1.1.0", **ipam) -> dict:
    conf = ipam_conf(version, name="clusternet", **ipam)
    conf["ipam"].pop("ranges")
    return conf


def pools(daemon, **records: dict) -> None:
    with daemon_store(daemon) as store:
        for name, settings in records.items():
            put_pool(store, name, **settings)


def blocks(daemon, pool: str) -> list[BlockRecord]:
    with daemon_store(daemon) as store:
        return [
            BlockRecord.from_bytes(kv.key, kv.value) for kv in store.range(blocks_prefix(pool))
        ]


def test_named_pools_dual_stack_with_block_gateways(cni_bin, daemons, pod):
    daemon = daemons()
    pools(daemon, v4={"cidr": "10.80.0.0/16", "gateway": "first"}, v6={"cidr": "fd80::/64"})
    conf = cluster_conf(pools=["v4", "v6"])
    args = "K8S_POD_NAMESPACE=prod;K8S_POD_NAME=web-0;K8S_POD_UID=u-42;IgnoreUnknown=1"
    add = run_ipam(cni_bin, daemon, "ADD", conf, netns=pod.path, args=args)
    assert add.ok, add.stdout + daemon.log()[-2000:]
    v4, v6 = add.json["ips"]
    (block,) = blocks(daemon, "v4")
    assert v4["address"].endswith("/16") and v4["gateway"] != v4["address"].split("/")[0]
    assert v4["gateway"] in (block.cidr.split("/")[0], "10.80.0.1")  # the block's first usable
    assert v6["address"].endswith("/64") and "gateway" not in v6
    (lease,) = handles(daemon, "clusternet")
    assert dict(lease.attributes) == {
        "namespace": "prod",
        "pod": "web-0",
        "podUID": "u-42",
        "node": "node1",
    }
    check = run_ipam(cni_bin, daemon, "CHECK", {**conf, "prevResult": add.json}, netns=pod.path)
    assert check.ok, check.stdout
    assert run_ipam(cni_bin, daemon, "STATUS", conf).ok
    assert run_ipam(cni_bin, daemon, "ADD", conf, netns=pod.path).json == add.json
    assert run_ipam(cni_bin, daemon, "DEL", conf).ok
    assert handles(daemon) == [] and blocks(daemon, "v4")[0].allocations == {}


def test_the_daemons_node_labels_choose_the_pool(cni_bin, daemons, pod):
    daemon = daemons(nodeLabels={"zone": "a"})
    pools(
        daemon,
        za={"cidr": "10.81.0.0/24", "node_selector": {"zone": "a"}},
        zb={"cidr": "10.82.0.0/24", "node_selector": {"zone": "b"}},
    )
    add = run_ipam(cni_bin, daemon, "ADD", cluster_conf(), netns=pod.path)
    assert add.ok, add.stdout
    assert addresses(add.json)[0].startswith("10.81.0.")


def test_no_pool_for_this_node_is_a_clear_error(cni_bin, daemons, pod):
    daemon = daemons(nodeLabels={"zone": "c"})
    pools(daemon, zb={"cidr": "10.82.0.0/24", "node_selector": {"zone": "b"}})
    add = run_ipam(cni_bin, daemon, "ADD", cluster_conf(), netns=pod.path)
    assert add.error_code() == 101 and add.json["msg"] == "no IP pool selects node node1"
    status = run_ipam(cni_bin, daemon, "STATUS", cluster_conf())
    assert status.error_code() == 50
    missing = run_ipam(cni_bin, daemon, "ADD", cluster_conf(pools=["nope"]), netns=pod.path)
    assert missing.error_code() == 7 and "ipam.pools[0]" in missing.json["msg"]


def test_exhaustion_names_pool_and_node_and_leaves_nothing(cni_bin, daemons, pod):
    daemon = daemons()
    pools(
        daemon,
        tiny={"cidr": "10.83.0.0/30", "block_size": 30, "strict_affinity": True},
        v6={"cidr": "fd83::/64"},
    )
    conf = cluster_conf(pools=["tiny", "v6"])
    for cid in ("c1", "c2"):  # .1 and .2
        assert run_ipam(cni_bin, daemon, "ADD", conf, cid=cid, netns=pod.path).ok
    full = run_ipam(cni_bin, daemon, "ADD", conf, cid="c3", netns=pod.path)
    assert full.error_code() == 101
    assert full.json["msg"] == "no address left in pool tiny for node node1"
    assert sorted(h.handle.container_id for h in handles(daemon)) == ["c1", "c2"]
    assert sum(len(b.allocations) for b in blocks(daemon, "v6")) == 2
    assert run_ipam(cni_bin, daemon, "STATUS", conf).error_code() == 50


def test_static_requests_on_a_cluster_pool(cni_bin, daemons, pod):
    daemon = daemons()
    pools(daemon, v4={"cidr": "10.84.0.0/24", "exclusions": ["10.84.0.200/29"]})
    conf = {**cluster_conf(pools=["v4"]), "capabilities": {"ips": True}}
    one = run_ipam(
        cni_bin,
        daemon,
        "ADD",
        conf,
        cid="c1",
        netns=pod.path,
        args="IP=10.84.0.77;K8S_POD_NAMESPACE=prod;K8S_POD_NAME=db-0",
    )
    assert addresses(one.json) == ["10.84.0.77/24"], one.stdout
    two = run_ipam(
        cni_bin,
        daemon,
        "ADD",
        {**conf, "runtimeConfig": {"ips": ["10.84.0.77/24"]}},
        cid="c2",
        netns=pod.path,
    )
    assert two.error_code() == 102 and "clusternet/c1/eth0" in two.json["msg"]
    assert "prod/db-0" in two.json["details"]
    excluded = run_ipam(
        cni_bin, daemon, "ADD", conf, cid="c3", netns=pod.path, args="IP=10.84.0.201"
    )
    assert excluded.error_code() == 7 and "excluded" in excluded.json["details"]
    assert [h.handle.container_id for h in handles(daemon)] == ["c1"]


def test_two_nodes_on_one_store_borrow_when_no_block_is_free(cni_bin, daemons, pod, tmp_path):
    shared = str(tmp_path / "shared.db")
    one = daemons("node1", shared)
    two = daemons("node2", shared)
    pools(one, small={"cidr": "10.85.0.0/29", "block_size": 30})  # .1-.3 and .4-.6
    conf = cluster_conf(pools=["small"])
    got = []
    adds = ((one, "a"), (two, "b"), (two, "c"), (two, "d"), (two, "e"))  # node2: 3 + 1
    for daemon, cid in adds:
        add = run_ipam(cni_bin, daemon, "ADD", conf, cid=cid, netns=pod.path)
        assert add.ok, add.stdout + daemon.log()[-2000:]
        got += addresses(add.json)
    assert len(set(got)) == 5
    by_node = {b.affinity: b for b in blocks(one, "small")}
    assert set(by_node) == {"node1", "node2"}
    borrowed = by_node["node1"].borrowed  # node2 filled its block and borrowed from node1's
    assert list(borrowed.values()) == ["node2"]
    (lender,) = [h for h in handles(one, "clusternet") if "borrowedFrom" in h.attributes]
    assert lender.attributes["borrowedFrom"] == "node1" and lender.node == "node2"
    for daemon, cid in adds:
        assert run_ipam(cni_bin, daemon, "DEL", conf, cid=cid).ok
    assert handles(one) == [] and all(not b.allocations for b in blocks(one, "small"))

"""The gateway rule through the real pycni-bridge (no Pod gets a bridge's address): with the shape
of conf/20-pycni-cluster.conflist (isGateway, isDefaultGateway) a small pool is filled completely,
on one node (SQLite) and on three (etcd, several blocks per node, borrowed addresses), and no
Pod address is ever an address of a bridge; every Pod's gateway is on its node's bridge and
named in the ADD result; the pool's last ADD fails with the exhaustion error and leaves nothing.
Also: a pool without gateways under isGateway (code 7, nothing written), netconf range shapes
(several ranges and range sets: several pycni gateways on one bridge), and a stale gateway on the
bridge that a pool now hands out (code 7 naming both)."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys

import pytest

from store.keys import blocks_prefix
from store.sqlite import SqliteStore
from tests.cluster.load import pycni_ipam_cli
from tests.fixtures.bridge import BridgeNode, new_cid
from tests.fixtures.ipam import run_reference
from tests.fixtures.netns import Netns
from tests.fixtures.plugins import PluginRun

pytestmark = pytest.mark.netns
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER_CONFLIST = os.path.join(REPO, "conf", "20-pycni-cluster.conflist")


def cluster_conf(pool: str, name: str = "gwnet") -> dict:
    """The single plugin of conf/20-pycni-cluster.conflist, on pool ``pool``."""
    with open(CLUSTER_CONFLIST) as fh:
        conflist = json.load(fh)
    (plugin,) = conflist["plugins"]
    return {
        "cniVersion": conflist["cniVersion"],
        "name": name,
        **plugin,
        "ipam": {**plugin["ipam"], "pools": [pool]},
    }


def pool_add_sqlite(store_path: str, *args: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cli", "ipam", "pool", "add", *args, "--store-path", store_path],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert out.returncode == 0, out.stdout + out.stderr


def bridge_ips(node: Netns, bridge: str = "pycni0") -> set[str]:
    data = json.loads(node.run(["ip", "-j", "addr", "show", "dev", bridge]).stdout)
    return {
        a["local"]
        for link in data
        for a in link["addr_info"]
        if not ipaddress.ip_address(a["local"]).is_link_local
    }


def default_gateway(pod: Netns) -> str:
    (route,) = json.loads(pod.run(["ip", "-j", "route", "show", "default"]).stdout)
    return route["gateway"]


def pod_ips(result: dict) -> list[str]:
    return [ip["address"].split("/")[0] for ip in result["ips"]]


def add_pods(
    runner: BridgeNode, netns_factory, conf: dict, count: int
) -> list[tuple[Netns, dict]]:
    """``count`` Pods added one after another: (pod netns, ADD result) each."""
    pods = []
    for _ in range(count):
        pod = netns_factory("pod")
        pods.append((pod, runner.add(conf, pod)[1]))
    return pods


def assert_gateway_rule(
    pods: list[tuple[Netns, dict]], bridges: dict[str, set[str]], node_of: list[str]
) -> None:
    """No Pod address on any bridge; each Pod's gateway in its result and on its bridge."""
    on_bridges = set().union(*bridges.values())
    leased = [ip for _, result in pods for ip in pod_ips(result)]
    assert len(leased) == len(set(leased))
    assert not on_bridges & set(leased), f"pod addresses on a bridge: {on_bridges & set(leased)}"
    for (pod, result), node in zip(pods, node_of, strict=True):
        gateways = [ip["gateway"] for ip in result["ips"]]
        assert all(gateways), f"an ADD result names no gateway: {result['ips']}"
        assert set(gateways) <= bridges[node], f"{gateways} not on the bridge of {node}"
        assert default_gateway(pod) == gateways[0]


def assert_exhausted(res: PluginRun, pool: str) -> None:
    assert res.error_code() == 101, res.stdout
    assert f"no address left in pool {pool}" in res.json["msg"]


def test_one_node_pool_filled_completely_never_gives_a_bridge_address(bridge_node, netns_factory):
    # a bridge address was once handed to a Pod this way; now with several blocks: /28 in /30
    # blocks, pool add's default
    pool_add_sqlite(bridge_node.store_path, "gw", "--cidr", "10.129.7.0/28", "--block-size", "30")
    conf = cluster_conf("gw")
    pods = add_pods(bridge_node, netns_factory, conf, 10)  # 4 blocks: 2 + 3 + 3 + 2 addresses
    bridge = bridge_ips(bridge_node.node)
    assert bridge == {"10.129.7.1", "10.129.7.4", "10.129.7.8", "10.129.7.12"}
    assert_gateway_rule(pods, {"node1": bridge}, ["node1"] * len(pods))
    before = bridge_node.residue("gwnet")
    res = bridge_node.run("ADD", conf, new_cid(), netns_factory("pod").path)
    assert_exhausted(res, "gw")
    assert bridge_node.residue("gwnet") == before and bridge_ips(bridge_node.node) == bridge


def test_pool_without_gateways_under_is_gateway_is_code_7_and_writes_nothing(
    bridge_node, netns_factory
):
    pool_add_sqlite(bridge_node.store_path, "nogw", "--cidr", "10.129.8.0/28", "--gateway", "none")
    pod = netns_factory("pod")
    res = bridge_node.run("ADD", cluster_conf("nogw", name="nogwnet"), new_cid(), pod.path)
    assert res.error_code() == 7, res.stdout
    assert (
        res.json["msg"] == "pool nogw hands out no gateway, but the netconf sets isDefaultGateway"
    )
    assert "pycni ipam pool set nogw --gateway first" in res.json["details"]
    assert bridge_node.residue("nogwnet").is_empty()
    assert "10.129.8.1" not in bridge_ips(bridge_node.node)
    assert pod.links() == ["lo"]
    store = SqliteStore(bridge_node.store_path)
    try:
        assert store.range(blocks_prefix("nogw"), keys_only=True) == []  # no block claimed
    finally:
        store.close()


def test_netconf_ranges_put_every_gateway_on_the_bridge_and_never_on_a_pod(
    bridge_node, netns_factory
):
    ranges = [
        [
            {"subnet": "10.131.0.0/29", "gateway": "10.131.0.6"},  # explicit, the range's end
            {"subnet": "10.131.0.8/29", "rangeStart": "10.131.0.9", "rangeEnd": "10.131.0.12"},
        ],
        [{"subnet": "10.131.1.0/28"}],
        [{"subnet": "fd00:131::/124"}],
    ]
    conf = {
        **cluster_conf("unused", name="rangenet"),
        "ipam": {"type": "pycni-ipam", "ranges": ranges},
    }
    # the first set: .1-.5 (gateway .6), .10-.12 (gateway .9 = subnet+1)
    pods = add_pods(bridge_node, netns_factory, conf, 8)
    bridge = bridge_ips(bridge_node.node)
    assert bridge == {"10.131.0.6", "10.131.0.9", "10.131.1.1", "fd00:131::1"}
    assert_gateway_rule(pods, {"node1": bridge}, ["node1"] * len(pods))
    before = bridge_node.residue("rangenet")
    res = bridge_node.run("ADD", conf, new_cid(), netns_factory("pod").path)
    assert res.error_code() == 101, res.stdout
    assert bridge_node.residue("rangenet") == before


def test_a_stale_gateway_on_the_bridge_is_never_a_pods_address(bridge_node, pycnid, netns_factory):
    # the block's gateway is .2 while .1 is excluded; without the exclusion it becomes .1 and
    # .2, still on the bridge, is an address the pool hands out: asked for, it is refused
    # (pycnid restarted: SQLite has no pool watch, and the bridge is looked at afresh)
    pool_add_sqlite(
        bridge_node.store_path, "moved", "--cidr", "10.129.9.0/29", "--exclude", "10.129.9.1"
    )
    conf = cluster_conf("moved", name="movednet")
    bridge_node.add(conf, netns_factory("pod"))
    assert "10.129.9.2" in bridge_ips(bridge_node.node)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "ipam",
            "pool",
            "set",
            "moved",
            "--remove-exclusion",
            "10.129.9.1",
            "--store-path",
            bridge_node.store_path,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert out.returncode == 0, out.stderr
    pycnid.stop()
    pycnid.start()
    before = bridge_node.residue("movednet")
    res = bridge_node.run("ADD", conf, new_cid(), netns_factory("pod").path, args="IP=10.129.9.2")
    assert res.error_code() == 7, res.stdout
    assert res.json["msg"] == (
        "the Pod's address 10.129.9.2/29 is already an address of bridge pycni0 (10.129.9.2/29)"
    )
    assert bridge_node.residue("movednet") == before


def test_other_gateway_address_is_still_refused_next_to_pycni_gateways(bridge_node, netns_factory):
    # pycni's own gateways (several, marked) coexist; an address someone else put there does not
    pool_add_sqlite(
        bridge_node.store_path, "two", "--cidr", "10.129.10.0/29", "--block-size", "30"
    )
    conf = cluster_conf("two", name="twonet")
    for _ in range(3):  # both blocks: gateways .1 and .4 on the bridge
        bridge_node.add(conf, netns_factory("pod"))
    assert bridge_ips(bridge_node.node) == {"10.129.10.1", "10.129.10.4"}
    bridge_node.node.run(["ip", "addr", "add", "10.99.0.1/24", "dev", "pycni0"])
    bridge_node.node.run(["ip", "addr", "del", "10.129.10.4/29", "dev", "pycni0"])  # re-added
    res = bridge_node.run("ADD", conf, new_cid(), netns_factory("pod").path)
    assert res.error_code() == 7, res.stdout
    assert "already has an address 10.99.0.1/24" in res.json["msg"]


def address_protos(node: Netns, bridge: str = "pycni0") -> dict[str, int]:
    """Each address of the bridge with its IFA_PROTO (0: none), as the kernel has it."""
    code = (
        "import json, sys; from pyroute2 import IPRoute; ipr = IPRoute(); "
        f"i = ipr.link_lookup(ifname={bridge!r})[0]; "
        "print(json.dumps({m.get('IFA_ADDRESS'): m.get('IFA_PROTO') or 0 "
        "for m in ipr.addr('dump', index=i)}))"
    )
    return json.loads(node.run([sys.executable, "-c", code]).stdout)


def test_a_gateway_set_before_marking_began_is_marked_when_it_is_wanted(
    bridge_node, pycnid, netns_factory
):
    """A bridge from before addresses carried pycni's protocol: its gateway is marked by the
    next ADD that wants it, so after a restart another block's gateway sits beside it."""
    pool_add_sqlite(
        bridge_node.store_path, "old", "--cidr", "10.129.11.0/28", "--block-size", "30"
    )
    conf = cluster_conf("old", name="oldnet")
    first = bridge_node.add(conf, netns_factory("pod"))[1]["ips"][0]["gateway"]
    bridge_node.node.run(f"ip addr del {first}/28 dev pycni0 && ip addr add {first}/28 dev pycni0")
    assert address_protos(bridge_node.node)[first] == 0  # as an older pycnid left it
    pycnid.stop()
    pycnid.start()
    again = bridge_node.add(conf, netns_factory("pod"))[1]["ips"][0]["gateway"]
    assert again == first and address_protos(bridge_node.node)[first] == 99
    pycnid.stop()
    pycnid.start()
    gateways = {first}
    while len(gateways) == 1:  # fill the own block until the next one is claimed
        gateways.add(bridge_node.add(conf, netns_factory("pod"))[1]["ips"][0]["gateway"])
    assert bridge_ips(bridge_node.node) == gateways


@pytest.mark.etcd
@pytest.mark.slow
def test_three_nodes_fill_a_pool_with_borrowing_and_no_pod_gets_a_bridge_address(
    make_cluster, netns_factory, cni_bin, cni_path
):
    cluster = make_cluster(nodes=3, ipam={"bufferSize": 0})  # no outage buffers: fill it all
    out = pycni_ipam_cli(
        cluster.nodes[0], "pool", "add", "gw3", "--cidr", "10.129.16.0/27", "--block-size", "29"
    )  # 4 blocks: 6 + 7 + 7 + 6 addresses
    assert out.returncode == 0, out.stdout + out.stderr
    runners = {
        n.name: BridgeNode(
            node=n.host.ns,
            socket=n.socket,
            exe=os.path.join(cni_bin, "pycni-bridge"),
            cni_path=cni_path,
            store_path="",
            host_local_dir="",
        )
        for n in cluster.nodes
    }
    conf = cluster_conf("gw3")
    # node2 and node3 claim a block each; node1 claims the other two, then borrows theirs
    order = ["node2", "node3"] * 3 + ["node1"] * 20
    pods = []
    for name in order:
        pod = netns_factory("pod")
        pods.append((pod, runners[name].add(conf, pod)[1]))
    bridges = {name: bridge_ips(r.node) for name, r in runners.items()}
    assert_gateway_rule(pods, bridges, order)
    handles = cluster.etcd.dump("/pycni/v1/handles/gwnet/")
    borrowed = [json.loads(value) for value, _ in handles.values()]
    assert any(h["attributes"].get("borrowedFrom") for h in borrowed)
    assert len(bridges["node1"]) >= 3  # its two blocks' gateways and a borrowed one's
    before = runners["node1"].residue("gwnet")  # veths and masquerade elements
    res = runners["node1"].run("ADD", conf, new_cid(), netns_factory("pod").path)
    assert_exhausted(res, "gw3")
    assert cluster.etcd.dump("/pycni/v1/handles/gwnet/").keys() == handles.keys()
    assert runners["node1"].residue("gwnet") == before
    assert bridge_ips(runners["node1"].node) == bridges["node1"]


def test_reference_bridge_under_pycni_ipam_is_protected_too(
    bridge_node, pycnid, cni_bin, netns_factory
):
    # pycni-ipam sees the whole netconf: the reference bridge's isGateway is refused the same
    pool_add_sqlite(
        bridge_node.store_path, "refnogw", "--cidr", "10.129.11.0/28", "--gateway", "none"
    )
    conf = {**cluster_conf("refnogw", name="refnet"), "type": "bridge", "bridge": "refbr0"}
    res = run_reference(
        bridge_node.node,
        "bridge",
        "ADD",
        conf,
        cni_bin=cni_bin,
        socket=pycnid.socket,
        cid=new_cid(),
        netns=netns_factory("pod").path,
    )
    assert res.error_code() == 7, res.stdout + res.stderr
    assert "pool refnogw hands out no gateway" in res.json["msg"]
    assert bridge_node.residue("refnet").leases == []

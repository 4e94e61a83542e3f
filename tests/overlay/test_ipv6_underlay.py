"""VXLAN over an IPv6 underlay: nodes whose underlay address is IPv6 (etcd still reached over
IPv4) carry IPv4 Pods with the IPv6 header's cost taken off (underlay − 70 on every link of the
path), the FDB points at IPv6 underlay addresses, and the firewall lists the peers in its IPv6
set."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.waiting import wait_for

from .pods import OverlayCluster
from .test_mtu import ICMP_OVERHEAD, df_ping, link_mtus

pytestmark = pytest.mark.etcd
OVERHEAD6 = 70  # outer IPv6 40 + UDP 8 + VXLAN 8 + inner Ethernet 14


def v6_of(index: int) -> str:
    return f"fd72::{index + 11}"


@pytest.fixture
def six(make_cluster, cni_bin, cni_path) -> OverlayCluster:
    cluster = OverlayCluster(make_cluster(nodes=0), cni_bin, cni_path, "vxlan", {})
    for index in range(2):
        node = cluster.add_node(start=False, underlayAddress=v6_of(index))
        node.host.ns.run(f"ip addr add {v6_of(index)}/64 dev eth0 nodad")
        node.daemon.start()
    cluster.add_pool("pods", "10.136.0.0/16", 26)
    cluster.wait_vteps()
    return cluster


def test_vxlan_over_an_ipv6_underlay_takes_70_bytes_and_reaches_the_other_node(six):
    records = six.records()
    assert [records[n.name]["overlay"]["underlay"] for n in six.nodes] == [v6_of(0), v6_of(1)]
    src, dst = (six.add_pod(node) for node in six.nodes)
    wait_for(f"{src.ip} -> {dst.ip}", lambda: src.ns.ping(dst.ip, timeout=1), 10, 0.2)
    want = 1500 - OVERHEAD6
    assert link_mtus(src) == dict.fromkeys(("pycni.1", "pycni0", "host veth", "pod eth0"), want)
    assert df_ping(src, dst, want - ICMP_OVERHEAD)
    assert not df_ping(src, dst, want - ICMP_OVERHEAD + 1)
    node = six.nodes[0].host.ns
    fdb = json.loads(node.run("bridge -j fdb show dev pycni.1").stdout)
    assert [f["dst"] for f in fdb if f.get("dst") and f["mac"] != "00:00:00:00:00:00"] == [
        v6_of(1)
    ]
    peers = json.loads(node.run("nft -j list set inet pycni-overlay peers6").stdout)
    assert [s["set"].get("elem") for s in peers["nftables"] if "set" in s] == [[v6_of(1)]]

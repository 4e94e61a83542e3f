"""The overlay MTU: underlay − 50 on the VXLAN device, the bridge and both veth ends, with the
underlay at 1500 and at 9000; the largest ping with don't-fragment set crosses nodes at that
MTU and one byte more does not. Each case pings between Pods of its own (fresh namespaces: a
path MTU learnt by one case would survive into the next for minutes)."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.waiting import wait_for

from .pods import OverlayCluster, Pod

pytestmark = pytest.mark.etcd
VXLAN_OVERHEAD = 50  # outer IPv4 20 + UDP 8 + VXLAN 8 + inner Ethernet 14
ICMP_OVERHEAD = 28  # IPv4 20 + ICMP 8


@pytest.fixture(scope="module", params=[1500, 9000])
def cluster(request, module_overlay) -> OverlayCluster:
    return module_overlay("vxlan", nodes=2, mtu=request.param)


def link_mtus(pod: Pod) -> dict[str, int]:
    """MTUs of the node's VXLAN device, the bridge, the Pod's host veth and its eth0."""
    node = pod.node.host.ns
    links = {link["ifname"]: link for link in json.loads(node.run("ip -j link").stdout)}
    host = [
        name
        for name, link in links.items()
        if link.get("master") == "pycni0" and pod.container_id in link.get("ifalias", "")
    ]
    pod_eth0 = json.loads(pod.ns.run("ip -j link show eth0").stdout)[0]
    return {
        "pycni.1": links["pycni.1"]["mtu"],
        "pycni0": links["pycni0"]["mtu"],
        "host veth": links[host[0]]["mtu"] if host else 0,
        "pod eth0": pod_eth0["mtu"],
    }


def df_ping(src: Pod, dst: Pod, payload: int) -> bool:
    return (
        src.ns.run(
            ["ping", "-4", "-c", "1", "-W", "2", "-M", "do", "-s", str(payload), dst.ip],
            check=False,
        ).returncode
        == 0
    )


def fresh_pair(cluster: OverlayCluster) -> tuple[Pod, Pod]:
    src, dst = (cluster.add_pod(node) for node in cluster.nodes)
    wait_for(f"{src.ip} -> {dst.ip}", lambda: src.ns.ping(dst.ip, timeout=1), 10, 0.2)
    return src, dst


def test_every_link_of_the_path_has_the_underlay_mtu_less_the_vxlan_header(cluster):
    want = cluster.mtu - VXLAN_OVERHEAD
    for node in cluster.nodes:
        assert cluster.records()[node.name]["overlay"]["mtu"] == want
    for pod in fresh_pair(cluster):
        assert link_mtus(pod) == dict.fromkeys(
            ("pycni.1", "pycni0", "host veth", "pod eth0"), want
        )


def test_the_largest_unfragmented_ping_crosses_nodes(cluster):
    src, dst = fresh_pair(cluster)
    assert df_ping(src, dst, cluster.mtu - VXLAN_OVERHEAD - ICMP_OVERHEAD)


def test_one_byte_above_the_mtu_does_not_cross_unfragmented(cluster):
    src, dst = fresh_pair(cluster)
    assert not df_ping(src, dst, cluster.mtu - VXLAN_OVERHEAD - ICMP_OVERHEAD + 1)
    assert df_ping(src, dst, 56)  # the pair itself is fine

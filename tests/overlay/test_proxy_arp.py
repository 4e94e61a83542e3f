"""The bridge of an overlay node answers ARP for remote Pods, and at once: with the kernel's
default ``proxy_delay`` (up to 0.8 s) the first packets to a new remote Pod waited in the
proxy queue and were dropped (make demo lost the first two of three pings)."""

from __future__ import annotations

import pytest

from .pods import BRIDGE, OverlayCluster

pytestmark = pytest.mark.etcd


def read_knob(cluster: OverlayCluster, node_index: int, path: str) -> str:
    node = cluster.nodes[node_index].host.ns
    return node.run(["cat", f"/proc/sys/net/ipv4/{path}"]).stdout.strip()


def test_bridge_answers_proxied_arp_without_delay(overlay_cluster):
    cluster: OverlayCluster = overlay_cluster("vxlan", nodes=2)
    pods = [cluster.add_pod(node) for node in cluster.nodes]
    for index in range(len(cluster.nodes)):
        assert read_knob(cluster, index, f"conf/{BRIDGE}/proxy_arp") == "1"
        assert read_knob(cluster, index, f"neigh/{BRIDGE}/proxy_delay") == "0"
    assert pods[0].ns.ping(pods[1].ip, timeout=5)

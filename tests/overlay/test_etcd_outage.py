"""An etcd outage never tears the network down: with etcd stopped, Pods on two nodes keep
talking, every node keeps its entries, one deleted by hand is still restored (the sync works
from its last complete view of the registry), and when etcd is back nothing has changed. A running
node's record removed by hand is published again."""

from __future__ import annotations

import pytest

from tests.fixtures.cluster import b64
from tests.fixtures.waiting import wait_for

from .kernel import read_state
from .pods import OverlayCluster

pytestmark = pytest.mark.etcd


def test_with_etcd_down_pods_keep_talking_and_deleted_entries_come_back(overlay_cluster):
    cluster: OverlayCluster = overlay_cluster("vxlan", nodes=2)
    src, dst = (cluster.add_pod(node) for node in cluster.nodes)
    wait_for(f"{src.ip} -> {dst.ip}", lambda: src.ns.ping(dst.ip, timeout=1), 10, 0.2)
    node = cluster.nodes[0].host.ns
    before = {n.name: read_state(n.host.ns) for n in cluster.nodes}
    etcd = cluster.cluster.etcd.members[0]
    etcd.kill()
    try:
        assert src.ns.ping(dst.ip, count=3, timeout=1) and dst.ns.ping(src.ip, timeout=1)
        gone = sorted(before[cluster.nodes[0].name].routes)[0]
        node.run(f"ip route del {gone[0]} proto 77")
        wait_for(
            "the deleted route back while etcd is down",
            lambda: read_state(node) == before[cluster.nodes[0].name],
            3,
            0.05,
        )
        assert src.ns.ping(dst.ip, timeout=1)
    finally:
        etcd.start()
    cluster.cluster.etcd.wait_healthy()
    assert {n.name: read_state(n.host.ns) for n in cluster.nodes} == before
    assert src.ns.ping(dst.ip, timeout=1)


def test_a_running_nodes_record_removed_by_hand_is_published_again(overlay_cluster):
    cluster: OverlayCluster = overlay_cluster("vxlan", nodes=2)
    first = cluster.nodes[0]
    published = cluster.records()[first.name]
    cluster.cluster.etcd.call("/v3/kv/deleterange", {"key": b64(f"/pycni/v1/nodes/{first.name}")})
    wait_for(
        "the node record back",
        lambda: cluster.records().get(first.name, {}).get("overlay") == published["overlay"],
        3,
        0.05,
    )

"""Full mesh across nodes: every Pod reaches every Pod on another node by its Pod IP, by ping
and by a TCP transfer, for both backends; a Pod holding a borrowed address is reachable from
every node."""
from __future__ import annotations

import itertools

import pytest

from tests.fixtures.waiting import wait_for
from .pods import OverlayCluster, Pod

pytestmark = pytest.mark.etcd


def wait_ping(src: Pod, dst: Pod, timeout: float = 10.0) -> None:
    wait_for(f"{src.ip} ({src.node.name}) -> {dst.ip} ({dst.node.name})",
             lambda: src.ns.ping(dst.ip, timeout=1), timeout, step=0.2)


def cross_pairs(pods: list[Pod]) -> list[tuple[Pod, Pod]]:
    return [(a, b) for a, b in itertools.permutations(pods, 2) if a.node is not b.node]


@pytest.mark.parametrize("backend", ["vxlan", "host-gw"])
def test_full_mesh_ping_between_pods_on_three_nodes(overlay_cluster, backend):
    cluster: OverlayCluster = overlay_cluster(backend)
    pods = [cluster.add_pod(node) for node in cluster.nodes for _ in range(2)]
    for src, dst in cross_pairs(pods):
        wait_ping(src, dst)

"""Overlay clusters: ``overlay_cluster(backend, nodes=3)`` builds node namespaces on an underlay
bridge (tests/fixtures/cluster.py), each with a pycnid running the overlay, one pool with
per-block gateways, and Pods added through the pycni-bridge executable."""
from __future__ import annotations

from typing import Callable, Iterator

import pytest

from tests.fixtures.cluster import make_cluster  # noqa: F401
from tests.fixtures.netns import new_netns
from .pods import OverlayCluster


@pytest.fixture
def overlay_cluster(make_cluster, cni_bin, cni_path) -> Iterator[Callable[..., OverlayCluster]]:
    made: list[OverlayCluster] = []

    def make(backend: str = "vxlan", nodes: int = 3, cidr: str = "10.131.0.0/16",
             block_size: int = 26, mtu: int = 1500, **overlay: object) -> OverlayCluster:
        cluster = make_cluster(nodes=0)
        built = OverlayCluster(cluster, cni_bin, cni_path, backend, dict(overlay), mtu)
        made.append(built)
        for _ in range(nodes):
            built.add_node()
        built.add_pool("pods", cidr, block_size)
        built.wait_vteps()
        return built

    yield make
    for built in made:
        built.close_pods()

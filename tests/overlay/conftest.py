"""Overlay clusters: ``overlay_cluster(backend, nodes=3)`` builds node namespaces on an underlay
bridge (tests/fixtures/cluster.py), each with a pycnid running the overlay, one pool with
per-block gateways, and Pods added through the pycni-bridge executable; ``etcd_members=3``
runs etcd as three members (one per control-plane namespace) instead of one.

``module_overlay`` is the same builder with the module's lifetime: a cluster takes seconds to
build, so tests that do not disturb each other (or put back what they changed) share one."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

import pytest

from tests.fixtures.cluster import Cluster
from tests.fixtures.etcd import require_etcd

from .pods import OverlayCluster

Builder = Callable[..., OverlayCluster]


@contextlib.contextmanager
def overlay_builder(
    cni_bin: str, cni_path: str, clusters: Callable[[int], Cluster]
) -> Iterator[Builder]:
    """``make(backend, nodes, cidr, block_size, mtu, daemon=None, etcd_members=1, **overlay)``:
    a cluster of ``clusters(etcd_members)`` with the overlay on every node and the pool
    ``pods``."""
    made: list[OverlayCluster] = []

    def make(
        backend: str = "vxlan",
        nodes: int = 3,
        cidr: str = "10.131.0.0/16",
        block_size: int = 26,
        mtu: int = 1500,
        daemon: dict | None = None,
        etcd_members: int = 1,
        **overlay: object,
    ) -> OverlayCluster:
        built = OverlayCluster(
            clusters(etcd_members),
            cni_bin,
            cni_path,
            backend,
            dict(overlay),
            mtu,
            daemon=dict(daemon or {}),
        )
        made.append(built)
        for _ in range(nodes):
            built.add_node()
        built.add_pool("pods", cidr, block_size)
        built.wait_vteps()
        return built

    try:
        yield make
    finally:
        for built in made:
            built.close_pods()


@pytest.fixture
def overlay_cluster(make_cluster, cni_bin, cni_path) -> Iterator[Builder]:
    with overlay_builder(
        cni_bin, cni_path, lambda members: make_cluster(nodes=0, etcd_members=members)
    ) as make:
        yield make


@pytest.fixture(scope="module")
def module_overlay(cni_bin, cni_path) -> Iterator[Builder]:
    """``overlay_cluster`` for a whole module (its clusters removed after its last test)."""
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    require_etcd()
    with contextlib.ExitStack() as stack:

        def cluster(etcd_members: int) -> Cluster:
            made = stack.enter_context(contextlib.closing(Cluster.create(etcd_members)))
            made.etcd.start()
            return made

        yield stack.enter_context(overlay_builder(cni_bin, cni_path, cluster))

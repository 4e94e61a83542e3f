"""Fixtures for cluster-scale tests: namespaces on an underlay, etcd inside the control plane,
one pycnid per node namespace. Everything is removed at teardown, also after a failure."""
from __future__ import annotations

import os
from typing import Callable, Iterator

import pytest

from tests.fixtures.cluster import Cluster
from tests.fixtures.etcd import require_etcd


@pytest.fixture
def make_cluster() -> Iterator[Callable[..., Cluster]]:
    """``make_cluster(nodes=3, etcd_members=1, **daemon_keys)``: a started cluster."""
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    require_etcd()
    made: list[Cluster] = []

    def make(nodes: int = 3, etcd_members: int = 1, **daemon_keys) -> Cluster:
        cluster = Cluster.create(etcd_members)
        made.append(cluster)
        cluster.etcd.start()
        for _ in range(nodes):
            cluster.add_node(**daemon_keys)
        return cluster

    yield make
    for cluster in made:
        cluster.close()

"""Fixtures for node liveness, outage and reaper tests: real etcd, stores closed at teardown."""
from __future__ import annotations

from typing import Callable, Iterator

import pytest

from ipam.store.etcd import EtcdStore
from tests.fixtures.etcd import etcd_server, etcd_shared, wipe_all_keys  # noqa: F401


@pytest.fixture
def open_store() -> Iterator[Callable[..., EtcdStore]]:
    """``open_store(endpoints, **kw)``: an EtcdStore closed when the test ends."""
    stores: list[EtcdStore] = []

    def make(endpoints, **kw) -> EtcdStore:
        store = EtcdStore(endpoints, **kw)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def store(etcd_shared, open_store) -> EtcdStore:  # noqa: F811
    """A store on the session's shared etcd, emptied first."""
    wipe_all_keys(etcd_shared)
    return open_store(etcd_shared.endpoints)


@pytest.fixture
def make_cluster():
    """``make_cluster(nodes, **daemon_keys)``: etcd in a control-plane namespace, one pycnid
    per node namespace on the underlay (tests/fixtures/cluster.py); all removed at teardown."""
    import os

    from tests.fixtures.cluster import Cluster
    from tests.fixtures.etcd import require_etcd

    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    require_etcd()
    made: list[Cluster] = []

    def make(nodes: int = 1, **daemon_keys) -> Cluster:
        cluster = Cluster.create(1)
        made.append(cluster)
        cluster.etcd.start()
        for _ in range(nodes):
            cluster.add_node(**daemon_keys)
        return cluster

    yield make
    for cluster in made:
        cluster.close()

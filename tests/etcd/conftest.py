"""Fixtures for tests against a real etcd: servers, clusters, mTLS, and stores closed at teardown."""
from __future__ import annotations

from typing import Callable, Iterator

import pytest

from ipam.store.etcd import EtcdStore
from tests.fixtures.etcd import (etcd_cluster, etcd_server, etcd_shared,  # noqa: F401
                                 etcd_tls, wipe_all_keys)


@pytest.fixture
def open_store() -> Iterator[Callable[..., EtcdStore]]:
    """``open_store(endpoints, **kw)``: an EtcdStore that is closed when the test ends."""
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
    """A store on the session's shared etcd, emptied first (revisions keep counting up)."""
    wipe_all_keys(etcd_shared)
    return open_store(etcd_shared.endpoints)

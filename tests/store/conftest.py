"""The `store` fixture: every Store implementation the contract suite runs against.

Each param yields a store; tests keep to their own key prefix (`ns` fixture), so one real
etcd can serve the whole module. The etcd param starts a real etcd: it carries the ``etcd``
marker, so ``-m "not etcd"`` runs the suite on SQLite alone.
"""

from __future__ import annotations

import uuid

import pytest

from store.etcd import EtcdStore
from store.sqlite import SqliteStore
from tests.fixtures.etcd import EtcdServer

STORES = ["sqlite", pytest.param("etcd", marks=pytest.mark.etcd)]


@pytest.fixture(scope="module")
def etcd_for_stores():
    """One real single-member etcd for a module's contract tests."""
    server = EtcdServer()
    try:
        yield server.start()
    finally:
        server.cleanup()


@pytest.fixture(params=STORES)
def store(request, tmp_path):
    if request.param == "sqlite":
        s = SqliteStore(str(tmp_path / "store.db"))
    elif request.param == "etcd":
        s = EtcdStore(request.getfixturevalue("etcd_for_stores").endpoints)
    else:
        raise AssertionError(f"unknown store param {request.param!r}")
    yield s
    s.close()


@pytest.fixture
def ns() -> str:
    """A key prefix of this test's own, under pycni's root."""
    return f"/pycni/v1/test-{uuid.uuid4().hex[:12]}/"

"""The `store` fixture: every Store implementation the contract suite runs against.

Each param yields a fresh, empty-enough store; tests keep to their own key prefix
(`ns` fixture) so a store shared by a session (one real etcd) works too.
"""
from __future__ import annotations

import uuid

import pytest

from ipam.store.sqlite import SqliteStore

STORES = ["sqlite"]


@pytest.fixture(params=STORES)
def store(request, tmp_path):
    if request.param == "sqlite":
        s = SqliteStore(str(tmp_path / "store.db"))
    else:
        raise AssertionError(f"unknown store param {request.param!r}")
    yield s
    s.close()


@pytest.fixture
def ns() -> str:
    """A key prefix of this test's own, under pycni's root."""
    return f"/pycni/v1/test-{uuid.uuid4().hex[:12]}/"

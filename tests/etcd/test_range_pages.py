"""A prefix read page by page (``EtcdStore.range_pages``) on a real etcd: for generated keys and
page sizes it yields exactly what one ``range_at`` gives, in key order, and it is one snapshot:
writes made between pages are not in it."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.base import Delete, Put

pytestmark = pytest.mark.etcd
RUNS = itertools.count()
KEYS = st.lists(st.text("ab/\u00e9z0", min_size=1, max_size=6), max_size=25, unique=True)


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(KEYS, st.integers(1, 7))
def test_pages_give_what_one_range_gives(store, keys, page):
    prefix = f"/pages/{next(RUNS)}/"
    ops = [Put(f"{prefix}{k}", k.encode()) for k in keys]
    ops += [Put(f"{prefix[:-1]}x", b"outside"), Put(f"/pages/{prefix}", b"outside")]
    store.txn([], ops)
    whole, revision = store.range_at(prefix)
    kvs, read = store.range_pages(prefix, page)
    paged = list(kvs)
    assert read == revision
    assert paged == whole
    assert [kv.key for kv in paged] == sorted(f"{prefix}{k}" for k in keys)


def test_pages_are_one_snapshot(store):
    prefix = "/snapshot/"
    store.txn([], [Put(f"{prefix}{i:02}", b"v0") for i in range(10)])
    kvs, revision = store.range_pages(prefix, 3)
    first = [next(kvs) for _ in range(3)]  # the first page is in; the rest is not read yet
    store.txn(
        [],
        [Put(f"{prefix}05", b"v1"), Delete(f"{prefix}07"), Put(f"{prefix}99", b"new")],
    )
    rest = list(kvs)
    assert [kv.key for kv in first + rest] == [f"{prefix}{i:02}" for i in range(10)]
    assert {kv.value for kv in rest} == {b"v0"}
    assert all(kv.mod_revision <= revision for kv in first + rest)

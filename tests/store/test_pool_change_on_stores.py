"""A pool change made by another writer (the CLI's ``pycni ipam pool set``) counts from the
very next ADD, on every store, with no wait: an ADD refused for the old setting is served under
the new one, and one the new setting forbids is refused (a 5 s pool-list timer once kept
refusing for about 7 s).

The operator writes through a store object of its own, as the CLI does (on SQLite a second
connection to the same file: another process's commit). Every pool selects only its own test's
node (one etcd serves the module)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from cni.spec.errors import AddressExhausted, InvalidConfig
from ipam.alloc.selection import Selection
from ipam.leases.service import LeaseService
from ipam.ops.pool_update import PoolUpdate
from ipam.ops.pools import set_pool
from ipam.records import HandleId
from store.base import Store
from store.etcd import EtcdStore
from store.sqlite import SqliteStore
from tests.fixtures.ipam_pools import put_pool


@pytest.fixture
def operator(request, store) -> Iterator[Store]:
    """Another writer on the same data: a second SQLite connection, or another etcd client."""
    if isinstance(store, SqliteStore):
        other: Store = SqliteStore(store.path)
    else:
        other = EtcdStore(request.getfixturevalue("etcd_for_stores").endpoints)
    yield other
    other.close()


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:8]


def test_gateway_setting_counts_from_the_next_add(store, operator, tag):
    pool, network = f"gw-{tag}", f"n{tag}"
    put_pool(
        operator, pool, "10.94.0.0/24", block_size=28, gateway="none", node_selector={"t": tag}
    )
    leases = LeaseService(store, f"node-{tag}")
    chosen = Selection(network, pools=(pool,), gateway_key="isGateway")
    with pytest.raises(InvalidConfig, match=f"pool {pool} hands out no gateway"):
        leases.acquire(HandleId(network, "a", "eth0"), chosen)

    set_pool(operator, pool, PoolUpdate(gateway="first"))
    record, _ = leases.acquire(HandleId(network, "a", "eth0"), chosen)  # no sleep
    assert record.ips[0].gateway is not None

    set_pool(operator, pool, PoolUpdate(gateway="none"))
    with pytest.raises(InvalidConfig, match=f"pool {pool} hands out no gateway"):
        leases.acquire(HandleId(network, "b", "eth0"), chosen)


def test_a_node_selector_change_counts_from_the_next_add(store, operator, tag):
    pool, network, labels = f"sel-{tag}", f"n{tag}", {"test": tag}
    put_pool(operator, pool, "10.95.0.0/24", block_size=28, node_selector={"test": "x" + tag})
    leases = LeaseService(store, f"node-{tag}", labels=labels)
    with pytest.raises(AddressExhausted):
        leases.acquire(HandleId(network, "a", "eth0"), Selection(network))

    set_pool(operator, pool, PoolUpdate(node_selector=labels))
    record, _ = leases.acquire(HandleId(network, "a", "eth0"), Selection(network))
    assert record.ips[0].pool == pool

    set_pool(operator, pool, PoolUpdate(node_selector={"test": "x" + tag}))
    with pytest.raises(AddressExhausted):
        leases.acquire(HandleId(network, "b", "eth0"), Selection(network))


def test_a_new_pool_for_the_node_is_used_by_the_next_add_on_sqlite(tmp_path, tag):
    """SQLite only: its change counter tells the next ADD that the pool list changed, so a
    pool added while another still serves the node is seen without a refusal (etcd learns
    it from pycnid's pool watch, tested in tests/liveness/test_pool_watch.py)."""
    path = str(tmp_path / "store.db")
    store, operator = SqliteStore(path), SqliteStore(path)
    try:
        labels, network = {"test": tag}, f"n{tag}"
        put_pool(operator, f"a-{tag}", "10.96.0.0/24", block_size=28, node_selector=labels)
        leases = LeaseService(store, f"node-{tag}", labels=labels)
        leases.acquire(HandleId(network, "a", "eth0"), Selection(network))
        put_pool(operator, f"b-{tag}", "fd96::/64", node_selector=labels)
        record, _ = leases.acquire(HandleId(network, "b", "eth0"), Selection(network))
        assert [ip.pool for ip in record.ips] == [f"a-{tag}", f"b-{tag}"]
    finally:
        operator.close()
        store.close()

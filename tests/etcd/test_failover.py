"""Failover and outages on real etcd: a member killed, the whole cluster down or hung, recovery."""

from __future__ import annotations

import time

import pytest

from cni.spec.errors import NotAvailable, TryAgainLater
from store.base import Compare, Put
from tests.fixtures.etcd import EtcdServer, free_port

pytestmark = pytest.mark.etcd


def create_with_retry(store, key: str, value: bytes, seconds: float) -> float:
    """Create-if-absent ``key``, retrying code 11 up to ``seconds``; returns the time it took.

    A failed compare after a retry means an earlier attempt was applied: the key then holds
    our value (nothing lost, nothing applied twice)."""
    start = time.monotonic()
    while True:
        try:
            result = store.txn([Compare(key, 0)], [Put(key, value)])
            assert result.succeeded or store.get(key).value == value
            return time.monotonic() - start
        except TryAgainLater:
            assert time.monotonic() - start < seconds, f"{key} not written in {seconds}s"


def test_each_member_killed_in_turn_writes_keep_working(etcd_cluster, open_store):
    store = open_store(etcd_cluster.endpoints)
    written, slowest = [], 0.0
    for round_, victim in enumerate(etcd_cluster.members):
        victim.kill()  # one of them is the leader when it dies
        for i in range(10):
            key = f"/fo/{round_}/{i}"
            slowest = max(slowest, create_with_retry(store, key, key.encode(), seconds=5))
            written.append(key)
        victim.start()
    assert slowest < 3.0, f"a write waited {slowest:.2f}s for failover"
    assert [kv.key for kv in store.range("/fo/")] == sorted(written)
    etcd_cluster.wait_healthy()


def test_a_dead_endpoint_in_the_list_costs_nothing_after_the_first_call(etcd_server, open_store):
    dead = f"http://127.0.0.1:{free_port()}"
    store = open_store([dead, etcd_server.endpoint], options={"endpointRetry": 30})
    store.get("/warm-up")  # may try the dead one first
    start = time.monotonic()
    for i in range(20):
        store.txn([], [Put(f"/k{i}", b"v")])
    assert time.monotonic() - start < 1.0


def test_quorum_lost_then_cluster_down_answers_11_fast_and_recovers(etcd_cluster, open_store):
    store = open_store(etcd_cluster.endpoints)
    store.txn([], [Put("/before", b"1")])
    for member in etcd_cluster.members[:2]:
        member.kill()
    # one member still answers, but without a quorum it cannot serve reads or writes
    start = time.monotonic()
    with pytest.raises(NotAvailable):
        store.status()
    assert time.monotonic() - start < 1.0
    start = time.monotonic()
    with pytest.raises(TryAgainLater) as err:
        store.get("/before")
    assert time.monotonic() - start < 3.0 and "without quorum" in err.value.msg

    etcd_cluster.members[2].kill()
    start = time.monotonic()
    with pytest.raises(TryAgainLater) as err:
        store.txn([Compare("/k", 0)], [Put("/k", b"1")])
    assert time.monotonic() - start < 3.0
    assert err.value.code == 11
    assert all(url in err.value.msg for url in etcd_cluster.endpoints)
    assert "Connection refused" in err.value.details

    start = time.monotonic()
    with pytest.raises(NotAvailable) as status:
        store.status()
    assert time.monotonic() - start < 1.0 and status.value.code == 50

    for member in etcd_cluster.members:
        member.start(wait=False)
    deadline = time.monotonic() + 10
    while True:  # the same store object, no reconnect by the caller
        try:
            store.status()
            break
        except NotAvailable:
            assert time.monotonic() < deadline, "store did not recover within 10 s"
    assert store.get("/before").value == b"1"
    assert store.txn([Compare("/k", 0)], [Put("/k", b"1")]).succeeded


def test_hung_etcd_never_hangs_the_caller(etcd_server: EtcdServer, open_store):
    """SIGSTOP: TCP still connects, nothing answers. Calls end on their deadline."""
    store = open_store(etcd_server.endpoints)
    store.txn([], [Put("/k", b"1")])
    etcd_server.pause()
    try:
        start = time.monotonic()
        with pytest.raises(TryAgainLater) as err:
            store.txn([], [Put("/k", b"2")])
        assert 2.0 <= time.monotonic() - start < 3.0
        assert "DEADLINE_EXCEEDED" in err.value.details
        start = time.monotonic()
        with pytest.raises(NotAvailable):
            store.status()
        assert time.monotonic() - start < 1.0
    finally:
        etcd_server.resume()
    deadline = time.monotonic() + 5
    while True:
        try:
            assert store.get("/k").value in (b"1", b"2")  # the timed-out put may have landed
            break
        except TryAgainLater:
            assert time.monotonic() < deadline


def test_timeouts_come_from_the_config(etcd_server, open_store):
    store = open_store(
        etcd_server.endpoints,
        options={"requestTimeout": 0.6, "callTimeout": 0.2, "statusTimeout": 0.3},
    )
    etcd_server.pause()
    try:
        start = time.monotonic()
        with pytest.raises(TryAgainLater):
            store.get("/k")
        assert time.monotonic() - start < 0.9
        start = time.monotonic()
        with pytest.raises(NotAvailable):
            store.status()
        assert time.monotonic() - start < 0.6
    finally:
        etcd_server.resume()

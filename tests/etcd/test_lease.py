"""Leases on real etcd: the keepalive loop holds a key past its TTL, re-grants an expired lease,
and close() revokes it so the key vanishes at once."""

from __future__ import annotations

import time

import pytest

from store.base import Put
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.etcd


def heartbeat(store, key: str):
    """An on_grant callback that (re)writes ``key`` on the lease, like a node heartbeat."""
    return lambda lease_id: store.txn([], [Put(key, b"alive", lease=lease_id)])


def test_plain_lease_expires_with_its_key(store):
    lease = store.grant_lease(2)
    store.txn([], [Put("/hb/plain", b"x", lease=lease)])
    assert 0 < store.lease_ttl(lease) <= 2
    wait_for("the key to expire", lambda: store.get("/hb/plain") is None, 5, step=0.05)
    assert store.lease_ttl(lease) == -1 and store.refresh_lease(lease) == 0


def test_keeper_holds_the_key_past_its_ttl_and_close_removes_it(etcd_server, open_store):
    store = open_store(etcd_server.endpoints)
    keeper = store.keep_lease(2, on_grant=heartbeat(store, "/hb/node1"))
    assert keeper.wait(3)
    time.sleep(3.5)  # well past the TTL
    kv = store.get("/hb/node1")
    assert kv is not None and kv.value == b"alive"
    assert keeper.grants == 1 and store.lease_ttl(keeper.lease_id) > 0
    reader = open_store(etcd_server.endpoints)
    store.close()  # revokes: the key goes now, not after the TTL
    assert reader.get("/hb/node1") is None


def test_keeper_regrants_a_lease_that_vanished(store):
    keeper = store.keep_lease(3, on_grant=heartbeat(store, "/hb/node2"))
    assert keeper.wait(3)
    first = keeper.lease_id
    store.revoke_lease(first)  # as if it expired during an outage
    assert store.get("/hb/node2") is None
    wait_for("a new lease", lambda: keeper.grants == 2 and keeper.wait(0), 4, step=0.05)
    assert keeper.lease_id != first
    assert store.get("/hb/node2").value == b"alive"
    keeper.stop()
    assert store.get("/hb/node2") is None


def test_keeper_rides_out_an_etcd_restart(etcd_server, open_store):
    store = open_store(etcd_server.endpoints)
    keeper = store.keep_lease(2, on_grant=heartbeat(store, "/hb/node3"))
    assert keeper.wait(3)
    etcd_server.kill()
    etcd_server.start()
    time.sleep(2.5)  # past the TTL: etcd renews leases on restart, the keeper from then on
    assert store.get("/hb/node3").value == b"alive"
    assert store.lease_ttl(keeper.lease_id) > 0


def test_keeper_started_while_etcd_is_down_grants_when_it_returns(etcd_server, open_store):
    store = open_store(etcd_server.endpoints, options={"requestTimeout": 0.5})
    etcd_server.kill()
    keeper = store.keep_lease(2, on_grant=heartbeat(store, "/hb/node4"))
    assert not keeper.wait(0.5) and keeper.lease_id == 0
    etcd_server.start()
    assert keeper.wait(5)
    assert store.get("/hb/node4").value == b"alive"

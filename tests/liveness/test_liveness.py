"""Node liveness on real etcd: the node record and the heartbeat on a kept lease; the heartbeat
goes with the lease when its keeper dies, comes back on a new lease (re-announcing the node),
and a SQLite store gets a node record but no heartbeat."""

from __future__ import annotations

import json
import time

import pytest

from cni.spec.errors import InvalidConfig
from nodes.liveness import (
    Liveness,
    NodeRecord,
    heartbeat_alive,
    heartbeat_key,
    node_key,
    supports_leases,
)
from nodes.options import calc_node_address, parse_node_options
from store.sqlite import SqliteStore
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.etcd


def test_start_writes_node_record_and_heartbeat_and_stop_revokes(store):
    record = NodeRecord("n1", "172.31.250.11", {"zone": "a"}, 1000.0)
    live = Liveness(store, record, ttl=2).start()
    assert live.wait(3)
    node = NodeRecord.from_bytes(node_key("n1"), store.get(node_key("n1")).value)
    assert node == record
    beat = json.loads(store.get(heartbeat_key("n1")).value)
    assert beat["node"] == "n1" and int(beat["lease"], 16) == live.lease_id
    time.sleep(2.5)  # past the TTL: the keepalive loop holds it
    assert heartbeat_alive(store, "n1")
    live.stop()
    assert not heartbeat_alive(store, "n1")
    assert store.get(node_key("n1")) is not None  # the record stays; only the heartbeat goes


def test_heartbeat_vanishes_after_the_ttl_when_the_keeper_dies(store):
    live = Liveness(store, NodeRecord("n2"), ttl=2).start()
    assert live.wait(3)
    live.keeper.stop(revoke=False)  # as a SIGKILLed pycnid: nobody refreshes, nobody revokes
    assert heartbeat_alive(store, "n2")
    started = time.monotonic()
    wait_for("the heartbeat to expire", lambda: not heartbeat_alive(store, "n2"), 5, step=0.05)
    assert time.monotonic() - started <= 3.5


def test_a_lost_lease_is_regranted_and_the_node_reannounced(store):
    live = Liveness(store, NodeRecord("n3"), ttl=3).start()
    assert live.wait(3)
    first_lease = live.lease_id
    first_rev = store.get(node_key("n3")).mod_revision
    store.revoke_lease(first_lease)  # as if it expired during an etcd outage
    assert not heartbeat_alive(store, "n3")
    wait_for("a new heartbeat", lambda: heartbeat_alive(store, "n3"), 4, step=0.05)
    assert live.lease_id != first_lease
    assert store.get(node_key("n3")).mod_revision > first_rev  # what the reaper watches
    live.stop()


def test_sqlite_store_gets_a_node_record_but_no_heartbeat(tmp_path):
    sqlite = SqliteStore(str(tmp_path / "store.db"))
    try:
        assert not supports_leases(sqlite)
        live = Liveness(sqlite, NodeRecord("solo", "", {}, 5.0), ttl=10).start()
        assert live.wait(0) and live.lease_id == 0
        assert NodeRecord.from_bytes("k", sqlite.get(node_key("solo")).value).started_at == 5.0
        assert sqlite.get(heartbeat_key("solo")) is None
        live.stop()
    finally:
        sqlite.close()


def test_node_options_defaults_and_errors():
    opts = parse_node_options({"nodeLabels": {"zone": "b"}, "ipam": {"bufferSize": 3}})
    assert opts.buffer_size == 3 and opts.heartbeat_ttl == 10 and opts.labels == {"zone": "b"}
    address = calc_node_address(opts.address, ("http://127.0.0.1:2379",))
    assert address == "127.0.0.1"  # the source address towards the first endpoint
    for bad, key in (
        ({"ipam": {"bufferSize": -1}}, "ipam.bufferSize"),
        ({"ipam": {"heartbeatTTL": 1}}, "ipam.heartbeatTTL"),
        ({"ipam": {"reapGrace": "1h"}}, "ipam.reapGrace"),
        ({"ipam": []}, "ipam"),
        ({"nodeLabels": {"a": 1}}, "nodeLabels"),
    ):
        with pytest.raises(InvalidConfig, match=key.replace(".", r"\.")):
            parse_node_options(bad)


def test_a_restart_announces_the_overlay_fields_the_peers_hold(tmp_path):
    """The record a restarted pycnid announces keeps the overlay fields of the one in the
    store (peers would drop the node's routes until its overlay writes them again); with
    none there, or an unreadable record, the record is announced as it is."""
    from nodes.liveness import with_announced_overlay
    from nodes.record import OverlayInfo
    from store.base import Put

    store = SqliteStore(str(tmp_path / "store.db"))
    try:
        fresh = NodeRecord("n5", "172.31.250.15", {}, 2000.0)
        assert with_announced_overlay(store, fresh) == fresh  # no record yet
        info = OverlayInfo("vxlan", "172.31.250.15", "66:00:00:00:00:05", ("10.1.0.1",), 1)
        Liveness(store, NodeRecord("n5", "172.31.250.15", {}, 1000.0, info), ttl=2).start()
        again = with_announced_overlay(store, fresh)
        assert again.overlay == info and again.started_at == 2000.0
        store.txn([], [Put(node_key("n5"), b"not json")])
        assert with_announced_overlay(store, fresh) == fresh
    finally:
        store.close()

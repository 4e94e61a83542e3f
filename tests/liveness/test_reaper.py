"""Dead-node reclamation on real etcd: release_node, and the reaper's grace period confirmed on
a second look; a live node (heartbeat present) is never touched, a node that comes back clears
the suspicion, and a heartbeat reappearing mid-reclamation stops it."""

from __future__ import annotations

import json
import time

import pytest

from nodes.liveness import Liveness, NodeRecord, heartbeat_key, node_key, write_node
from nodes.reaper import NodeIsAlive, reap_dead_nodes, release_node, suspect_key
from store.base import Compare, Put
from store.keys import affinity_prefix
from tests.fixtures.liveness import allocations, blocks_of, handles_of, seed_lease, seed_pool

pytestmark = pytest.mark.etcd
GRACE = 300.0


@pytest.fixture
def cluster(store):
    """node "live" (heartbeat kept) and node "dead" (record, no heartbeat); "dead" holds two
    addresses in its own block, one borrowed in live's block, and an outage buffer."""
    seed_pool(store)
    live = Liveness(store, NodeRecord("live"), ttl=5).start()
    assert live.wait(3)
    write_node(store, NodeRecord("dead"))
    seed_lease(store, "live", "10.77.0.1")
    seed_lease(store, "dead", "10.77.1.1")
    seed_lease(store, "dead", "10.77.1.2", network="_buffer", cid="dead")  # _buffer/dead/eth0
    seed_lease(store, "dead", "10.77.0.2", block_owner="live")  # borrowed
    yield store
    live.stop()


def test_release_node_frees_every_handle_of_the_node_and_returns_its_blocks(cluster):
    report = release_node(cluster, "dead")
    assert report.complete and not report.stopped
    assert sorted(report.released_ips) == ["10.77.0.2", "10.77.1.1", "10.77.1.2"]
    assert handles_of(cluster, "dead") == []
    assert set(allocations(cluster)) == {"10.77.0.1"}  # live's lease untouched
    assert blocks_of(cluster, "dead") == [] and blocks_of(cluster, "live") == ["10.77.0.0/26"]
    assert cluster.range(affinity_prefix("dead")) == []  # the index goes with the block
    assert release_node(cluster, "dead").released == []  # again: nothing left


def test_release_node_refuses_a_live_node_unless_forced(cluster):
    with pytest.raises(NodeIsAlive, match="node live is alive"):
        release_node(cluster, "live")
    assert handles_of(cluster, "live")
    assert release_node(cluster, "live", force=True).released_ips == ["10.77.0.1"]


def test_release_node_dry_run_writes_nothing(cluster):
    before = cluster.revision()
    report = release_node(cluster, "dead", dry_run=True)
    assert sorted(report.released_ips) == ["10.77.0.2", "10.77.1.1", "10.77.1.2"]
    assert report.blocks_returned == ["seedpool/10.77.1.0/26"]
    assert cluster.revision() == before


def test_reaper_needs_the_grace_period_and_a_second_look(cluster):
    t0 = time.time()
    first = reap_dead_nodes(cluster, t0, GRACE, self_node="live")
    assert {v.node: v.state for v in first.nodes} == {"dead": "suspect"}
    seen = json.loads(cluster.get(suspect_key("dead")).value)
    assert seen["since"] == t0 and seen["revision"] >= cluster.get(node_key("dead")).mod_revision
    assert len(handles_of(cluster, "dead")) == 3  # one look releases nothing

    waiting = reap_dead_nodes(cluster, t0 + GRACE - 1, GRACE, self_node="live")
    assert waiting.nodes[0].state == "waiting" and len(handles_of(cluster, "dead")) == 3

    reaped = reap_dead_nodes(cluster, t0 + GRACE + 1, GRACE, self_node="live")
    assert reaped.reaped == ["dead"] and not reaped.errors
    assert handles_of(cluster, "dead") == [] and set(allocations(cluster)) == {"10.77.0.1"}
    assert cluster.get(node_key("dead")) is None and cluster.get(suspect_key("dead")) is None
    assert handles_of(cluster, "live")  # never the live node's


def test_a_live_node_is_never_suspected_even_by_another_nodes_reaper(cluster):
    for offset in (0, GRACE + 1, 3 * GRACE):
        report = reap_dead_nodes(cluster, time.time() + offset, GRACE, self_node="other")
        assert {v.node: v.state for v in report.nodes}["live"] == "alive"
    assert cluster.get(suspect_key("live")) is None and handles_of(cluster, "live")


def test_a_node_that_comes_back_clears_the_suspicion(cluster):
    t0 = time.time()
    reap_dead_nodes(cluster, t0, GRACE, self_node="live")
    back = Liveness(cluster, NodeRecord("dead"), ttl=5).start()
    assert back.wait(3)
    report = reap_dead_nodes(cluster, t0 + GRACE + 1, GRACE, self_node="live")
    assert {v.node: v.state for v in report.nodes}["dead"] == "cleared"
    assert cluster.get(suspect_key("dead")) is None and len(handles_of(cluster, "dead")) == 3
    back.stop()


def test_a_node_back_and_gone_again_between_looks_restarts_the_grace(cluster):
    """The node re-announced itself (record rewritten) and died again between two passes:
    the heartbeat is absent at both looks, but the suspicion starts over."""
    t0 = time.time()
    reap_dead_nodes(cluster, t0, GRACE, self_node="live")
    write_node(cluster, NodeRecord("dead"))  # a re-grant rewrites the record
    report = reap_dead_nodes(cluster, t0 + GRACE + 1, GRACE, self_node="live")
    assert report.nodes[0].state == "suspect"
    assert json.loads(cluster.get(suspect_key("dead")).value)["since"] == t0 + GRACE + 1
    assert len(handles_of(cluster, "dead")) == 3


def test_a_heartbeat_reappearing_mid_reclamation_stops_it(cluster):
    lease = cluster.grant_lease(30)
    guard = Compare(heartbeat_key("dead"), 0)
    cluster.txn([], [Put(heartbeat_key("dead"), b"{}", lease=lease)])  # it just came back
    report = release_node(cluster, "dead", force=True, guards=[guard])
    assert report.stopped and "came back" in report.stopped + str(report.to_dict())
    assert len(handles_of(cluster, "dead")) == 3  # nothing was taken
    cluster.revoke_lease(lease)


def test_the_reaper_never_acts_on_a_store_without_heartbeats(tmp_path):
    from store.sqlite import SqliteStore

    sqlite = SqliteStore(str(tmp_path / "store.db"))
    try:
        seed_pool(sqlite)
        seed_lease(sqlite, "solo", "10.77.2.1")
        for offset in (0, 10 * GRACE):
            report = reap_dead_nodes(sqlite, time.time() + offset, GRACE)
            assert report.nodes == [] and "no heartbeats" in report.skipped
        assert handles_of(sqlite, "solo") and sqlite.get(suspect_key("solo")) is None
    finally:
        sqlite.close()

"""The store side of outage handling on a real etcd: a request's budget caps each call (etcd
gone: answered within it, not the store's 2.5 s), and the tracking wrapper makes the store
suspect on a failed call, down on a failed probe, fails a request's calls at once while down,
and marks it up on the next answer."""

from __future__ import annotations

import threading
import time

import pytest

from cni.spec.errors import NotAvailable, TryAgainLater
from ipam.outage.store import Reachability, StoreUnreachable, TrackedStore
from store.deadline import bound, call_budget, current_budget, in_request

pytestmark = pytest.mark.etcd


def test_call_budget_is_per_thread_and_nested_budgets_keep_the_smallest():
    assert current_budget() is None and bound(2.5) == 2.5 and not in_request()
    seen = []
    with call_budget(0.5):
        with call_budget(5):
            assert current_budget() == 0.5 and in_request()
        thread = threading.Thread(target=lambda: seen.append(current_budget()))
        thread.start()
        thread.join()
        assert bound(2.5) == 0.5 and bound(0.1) == 0.1
    assert seen == [None] and current_budget() is None


def test_a_call_to_a_dead_etcd_ends_within_the_budget(etcd_server, open_store):
    store = open_store(etcd_server.endpoints)
    store.get("/warm")  # connected once
    etcd_server.kill()
    started = time.monotonic()
    with call_budget(0.4), pytest.raises(TryAgainLater, match="unreachable"):
        store.get("/pycni/v1/x")
    assert time.monotonic() - started < 0.9
    started = time.monotonic()
    with pytest.raises(TryAgainLater):
        store.get("/pycni/v1/x")  # without a deadline: the store's own requestTimeout
    assert time.monotonic() - started > 2.0


def test_tracked_store_marks_down_on_failure_and_up_on_the_next_answer(etcd_server, open_store):
    tracked = TrackedStore(
        open_store(etcd_server.endpoints, options={"requestTimeout": 0.5}), Reachability()
    )
    assert tracked.get("/none") is None and not tracked.reach.down
    etcd_server.kill()
    probes = []
    tracked.reach.on_suspect = lambda: probes.append(1)
    with pytest.raises(StoreUnreachable) as caught:
        tracked.get("/none")
    assert caught.value.code == 11 and tracked.reach.suspect and probes == [1]
    assert not tracked.reach.down  # one call without an answer is not an outage yet
    with pytest.raises(NotAvailable):
        tracked.status()  # the probe confirms it
    assert tracked.reach.down
    with call_budget(2.0):  # a request's call while the store is known down: no call at all
        started = time.monotonic()
        with pytest.raises(StoreUnreachable, match="unreachable"):
            tracked.range("/pycni/v1/")
        assert time.monotonic() - started < 0.05
    etcd_server.start()
    deadline = time.monotonic() + 10
    while tracked.reach.down:
        assert time.monotonic() < deadline, "the store never came back up"
        try:
            tracked.status()
        except NotAvailable:
            time.sleep(0.2)
    assert tracked.get("/none") is None and tracked.reach.changed.is_set()
    assert not tracked.reach.suspect

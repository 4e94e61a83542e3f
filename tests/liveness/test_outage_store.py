"""The store side of outage handling on a real etcd: a per-request deadline bounds every call
(etcd gone: answered within the deadline, not the store's 2.5 s), and the tracking wrapper
marks the store down on a failure and up again on the next answer."""
from __future__ import annotations

import threading
import time

import pytest

from cni.spec.errors import NotAvailable, TryAgainLater
from ipam.outage_store import Reachability, StoreUnreachable, TrackedStore
from ipam.store.deadline import bound, call_deadline, remaining

pytestmark = pytest.mark.etcd


def test_deadline_is_per_thread_and_nested_deadlines_keep_the_earliest():
    assert remaining() is None and bound(2.5) == 2.5
    seen = []
    with call_deadline(0.5):
        with call_deadline(5):
            assert 0 < remaining() <= 0.5
        thread = threading.Thread(target=lambda: seen.append(remaining()))
        thread.start()
        thread.join()
        assert bound(2.5) <= 0.5
    assert seen == [None] and remaining() is None


def test_a_call_to_a_dead_etcd_ends_at_the_deadline(etcd_server, open_store):
    store = open_store(etcd_server.endpoints)
    store.get("/warm")  # connected once
    etcd_server.kill()
    started = time.monotonic()
    with call_deadline(0.4), pytest.raises(TryAgainLater, match="unreachable"):
        store.get("/pycni/v1/x")
    assert time.monotonic() - started < 0.9
    started = time.monotonic()
    with pytest.raises(TryAgainLater):
        store.get("/pycni/v1/x")  # without a deadline: the store's own requestTimeout
    assert time.monotonic() - started > 2.0


def test_tracked_store_marks_down_on_failure_and_up_on_the_next_answer(etcd_server, open_store):
    tracked = TrackedStore(open_store(etcd_server.endpoints, options={"requestTimeout": 0.5}),
                           Reachability())
    assert tracked.get("/none") is None and not tracked.reach.down
    etcd_server.kill()
    with pytest.raises(StoreUnreachable) as caught:
        tracked.get("/none")
    assert caught.value.code == 11 and tracked.reach.down
    with pytest.raises(NotAvailable):
        tracked.status()
    assert tracked.reach.down
    with call_deadline(0.001):
        time.sleep(0.01)
        started = time.monotonic()
        with pytest.raises(StoreUnreachable, match="did not answer in time"):
            tracked.range("/pycni/v1/")  # past the deadline: no call at all
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

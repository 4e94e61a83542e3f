"""Group commit (ipam/leases/combiner.py) under real threads: every caller gets its own value or
error, concurrent callers share txns, one leader at a time, lost compares are retried."""

from __future__ import annotations

import threading
import time

import pytest

from cni.spec.errors import TryAgainLater
from ipam.alloc.plan import Plan
from ipam.leases.combiner import Combiner


class Store:
    """A commit that takes a while (so callers pile up) and records each txn's keys."""

    def __init__(self, lose: int = 0) -> None:
        self.txns: list[list[str]] = []
        self.lose = lose
        self.refreshed = 0
        self.inside = 0
        self.peak = 0
        self.guard = threading.Lock()

    def commit(self, plan: Plan) -> bool:
        with self.guard:
            self.inside += 1
            self.peak = max(self.peak, self.inside)
        time.sleep(0.005)
        with self.guard:
            self.inside -= 1
        if self.lose:
            self.lose -= 1
            return False
        self.txns.append(sorted(plan.puts))
        return True

    def refresh(self, _plan: Plan) -> None:
        self.refreshed += 1


def job(key: str):
    def plan(p: Plan) -> str:
        if key.startswith("bad"):
            raise ValueError(key)
        p.put(key, 0, b"v")
        return f"value-{key}"

    return plan


def run_callers(combiner: Combiner, keys: list[str]) -> dict[str, object]:
    results: dict[str, object] = {}
    start = threading.Barrier(len(keys))

    def caller(key: str) -> None:
        start.wait()
        try:
            results[key] = combiner.run(job(key), key)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            results[key] = exc

    threads = [threading.Thread(target=caller, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads), "a caller never returned"
    return results


def test_every_caller_gets_its_own_value_and_txns_are_shared() -> None:
    store = Store()
    combiner = Combiner(store.commit, store.refresh, max_batch=8)
    keys = [f"k{i:02d}" for i in range(40)]
    results = run_callers(combiner, keys)
    assert results == {k: f"value-{k}" for k in keys}
    assert sorted(k for txn in store.txns for k in txn) == keys  # each written exactly once
    assert len(store.txns) < len(keys)  # callers shared txns
    assert max(len(t) for t in store.txns) <= 8
    assert store.peak == 1  # one leader at a time
    assert not combiner._leading and not combiner._queue


def test_a_failing_job_gets_its_error_and_the_others_their_values() -> None:
    store = Store()
    combiner = Combiner(store.commit, store.refresh)
    results = run_callers(combiner, ["a", "bad1", "b", "bad2", "c"])
    assert isinstance(results["bad1"], ValueError) and isinstance(results["bad2"], ValueError)
    assert {k: results[k] for k in "abc"} == {k: f"value-{k}" for k in "abc"}


def test_a_lost_compare_is_refreshed_and_planned_again() -> None:
    store = Store(lose=2)
    combiner = Combiner(store.commit, store.refresh)
    assert combiner.run(job("x")) == "value-x"
    assert store.refreshed == 2 and store.txns == [["x"]]


def test_a_store_that_keeps_losing_says_try_again_later() -> None:
    store = Store(lose=100)
    combiner = Combiner(store.commit, store.refresh, attempts=3, store_name="etcd")
    with pytest.raises(TryAgainLater, match="after 3 attempts"):
        combiner.run(job("x"), "lease for x")
    assert combiner._leading is False  # the next caller can lead


def test_a_waiter_is_woken_only_for_its_own_job() -> None:
    """Callers wait on an event of their own: set once their job is done (or they lead)."""
    store = Store()
    combiner = Combiner(store.commit, store.refresh, max_batch=1)
    woken: list[str] = []
    original = threading.Event.wait

    def counting_wait(self, timeout=None):
        got = original(self, timeout)
        woken.append(threading.current_thread().name)
        return got

    threading.Event.wait = counting_wait  # type: ignore[method-assign]
    try:
        results = run_callers(combiner, [f"k{i}" for i in range(12)])
    finally:
        threading.Event.wait = original  # type: ignore[method-assign]
    assert all(v == f"value-{k}" for k, v in results.items())
    callers = [n for n in woken if n != "MainThread"]
    assert len(callers) <= 12  # at most one wake-up per caller, however many txns ran

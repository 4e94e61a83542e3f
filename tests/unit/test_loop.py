"""The one background loop (common/loop.py): prompt stop, errors counted and logged once per
failing stretch (a bug with its stack), the owner's wake event, and doubling backoff."""

from __future__ import annotations

import logging
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from cni.spec.errors import TryAgainLater
from common.loop import FOREVER, Backoff, Errors, Loop, Periodic
from tests.fixtures.waiting import wait_for

GUARD = 5.0
LOG = logging.getLogger("pycnid.test-loop")


class Counter:
    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def inc(self, loop: str) -> None:
        self.values[loop] = self.values.get(loop, 0) + 1


class Registry:  # what a loop asks of pycnid's metrics registry: one counter
    def __init__(self) -> None:
        self.counters: dict[str, Counter] = {}

    def counter(self, name: str, help_text: str) -> Counter:
        return self.counters.setdefault(name, Counter())


def failing(errors: list[BaseException], then: float = FOREVER):
    """A step that raises each of ``errors`` in turn, then returns ``then``."""
    calls: list[int] = []

    def step() -> float:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return then

    return step, calls


def test_stop_is_prompt_during_a_long_pause():
    loop = Periodic("test-long", 3600, lambda: None).start()
    started = time.monotonic()
    loop.stop()
    assert time.monotonic() - started < 1 and not loop._thread.is_alive()


def test_a_step_returning_none_ends_the_loop():
    loop = Loop("test-done", lambda: None).start()
    loop._thread.join(GUARD)
    assert not loop._thread.is_alive()


def test_wake_ends_a_pause_and_stop_wakes_it():
    wake, rounds = threading.Event(), []
    loop = Loop("test-wake", lambda: rounds.append(1) or FOREVER, wake=wake).start()
    wait_for("the first step", lambda: len(rounds) == 1, GUARD, step=0.01)
    wake.set()
    wait_for("a woken step", lambda: len(rounds) == 2, GUARD, step=0.01)
    loop.stop()
    assert not loop._thread.is_alive() and len(rounds) == 2


def test_errors_are_counted_and_the_loop_goes_on():
    step, calls = failing([TryAgainLater("store away"), RuntimeError("bug")])
    registry = Registry()
    loop = Loop("test-count", step, retry=0.001, registry=registry).start()
    wait_for("three steps", lambda: len(calls) == 3, GUARD, step=0.01)
    loop.stop()
    assert loop.errors == 2 and loop.failures == 0
    assert registry.counters["pycni_loop_errors_total"].values == {"test-count": 2}


def test_expected_errors_are_one_line_per_stretch_and_a_bug_has_its_stack(caplog):
    errors = [
        TryAgainLater("away"),
        TryAgainLater("away"),
        RuntimeError("bug"),
        RuntimeError("bug"),
    ]
    step, calls = failing(errors)
    with caplog.at_level(logging.DEBUG, logger=LOG.name):
        loop = Loop("test-log", step, retry=0.001, errors=Errors(LOG, "test loop")).start()
        wait_for("five steps", lambda: len(calls) == 5, GUARD, step=0.01)
        loop.stop()
    mine = [r for r in caplog.records if r.name == LOG.name]
    warnings = [r for r in mine if r.levelno == logging.WARNING]
    stacks = [r for r in mine if r.exc_info]
    assert [r.getMessage() for r in warnings] == ["test loop: away"]
    assert len(stacks) == 1 and stacks[0].levelno == logging.ERROR
    assert any("working again after 4" in r.getMessage() for r in mine)


def test_a_failure_while_stopping_is_not_reported(caplog):
    gate = threading.Event()

    def step() -> float:
        gate.wait(GUARD)
        raise RuntimeError("interrupted by the stop")

    loop = Loop("test-stopping", step, errors=Errors(LOG)).start()
    loop.stop(wait=False)
    gate.set()
    loop.join()
    assert loop.errors == 0 and not any(r.exc_info for r in caplog.records)


def test_retry_may_be_a_backoff():
    backoff = Backoff(0.1, 1.0)
    assert [backoff.next() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.reset().next() == 0.1 and backoff.next() == 0.2


def test_a_periodic_first_run_waits_first():
    rounds: list[float] = []
    loop = Periodic("test-first", 0.01, lambda: rounds.append(time.monotonic()), first=0.2).start()
    started = time.monotonic()
    wait_for("a round", lambda: rounds, GUARD, step=0.01)
    loop.stop()
    assert rounds[0] - started >= 0.15


OUTCOMES = st.lists(st.sampled_from(["ok", "expected", "bug"]), max_size=30)


@settings(max_examples=200, deadline=None, database=None)
@given(OUTCOMES)
def test_any_run_of_steps_is_counted_and_logged_once_per_stretch_and_kind(outcomes):
    """Whatever steps succeed or fail, in any order: every failure is counted (attribute and
    metric), ``failures`` is the current stretch, and each kind of failure is logged at its
    level once per stretch (a bug with its stack), repeats at debug only."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("pycnid.test-loop-generated")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    registry = Registry()
    script = iter(outcomes)

    def step() -> float:
        kind = next(script)
        if kind == "expected":
            raise TryAgainLater("the store is away")
        if kind == "bug":
            raise KeyError("a bug")
        return 1.0

    loop = Loop("generated", step, retry=0.0, errors=Errors(logger, "gen"), registry=registry)
    try:
        for _ in outcomes:
            loop._step()
    finally:
        logger.removeHandler(handler)
    failed = [o for o in outcomes if o != "ok"]
    assert loop.errors == len(failed)
    assert registry.counters["pycni_loop_errors_total"].values.get("generated", 0) == len(failed)
    stretch = list(reversed(outcomes))
    current = next((i for i, o in enumerate(stretch) if o == "ok"), len(stretch))
    assert loop.failures == current
    expected_logs = sum(1 for stretch_kinds in stretches(outcomes) for _ in stretch_kinds)
    loud = [r for r in records if r.levelno > logging.INFO]
    assert len(loud) == expected_logs
    assert all(r.exc_info for r in loud if r.levelno == logging.ERROR)


def stretches(outcomes: list[str]) -> list[set[str]]:
    """The kinds of failure in each failing stretch (a stretch ends at a step that returns)."""
    out: list[set[str]] = [set()]
    for outcome in outcomes:
        if outcome == "ok":
            out.append(set())
        else:
            out[-1].add(outcome)
    return out

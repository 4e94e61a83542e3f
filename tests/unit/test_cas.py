"""The one compare-and-swap retry (store/cas.py): attempts, backoff bounds, jitter, the
error on giving up and the conflict/retry callbacks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni.spec.errors import TryAgainLater
from store.cas import LOST, Retry, run_cas


def lose(times: int, value: object = "done"):
    calls: list[int] = []

    def attempt() -> object:
        calls.append(1)
        return LOST if len(calls) <= times else value

    return attempt, calls


def test_the_first_attempt_that_does_not_lose_is_returned():
    attempt, calls = lose(2)
    pauses: list[float] = []
    assert run_cas(attempt, Retry(5), TryAgainLater("x"), sleep=pauses.append) == "done"
    assert len(calls) == 3 and pauses == []


def test_none_is_a_result_not_a_conflict():
    attempt, calls = lose(0, value=None)
    assert run_cas(attempt, Retry(3), TryAgainLater("x")) is None and len(calls) == 1


def test_gives_up_after_n_attempts_with_the_loops_error():
    attempt, calls = lose(99)
    with pytest.raises(TryAgainLater, match="kept changing"):
        run_cas(attempt, Retry(4), TryAgainLater("the keys kept changing"), sleep=lambda _: None)
    assert len(calls) == 4


def test_a_callable_give_up_returns_its_value():
    attempt, _ = lose(99)
    assert run_cas(attempt, Retry(2), lambda: "handed over", sleep=lambda _: None) == "handed over"


def test_conflicts_and_retries_are_counted():
    attempt, _ = lose(3)
    conflicts, retries = [], []
    run_cas(
        attempt,
        Retry(8),
        TryAgainLater("x"),
        sleep=lambda _: None,
        on_conflict=lambda: conflicts.append(1),
        on_retry=lambda: retries.append(1),
    )
    assert len(conflicts) == 3 and len(retries) == 3


def test_exponential_backoff_doubles_up_to_the_cap_after_the_immediate_retries():
    retry = Retry(16, base=0.004, cap=0.05, jitter=True, immediate=1)
    assert [retry.bound(n) for n in range(1, 7)] == [0.0, 0.004, 0.008, 0.016, 0.032, 0.05]
    for n in range(1, 16):
        assert 0 <= retry.pause(n) <= retry.bound(n) <= 0.05


def test_linear_backoff_without_jitter_is_exact():
    retry = Retry(5, base=0.02, linear=True)
    assert [retry.pause(n) for n in range(1, 5)] == [0.02, 0.04, 0.06, 0.08]


def test_the_pauses_between_attempts_follow_the_retry():
    attempt, _ = lose(3)
    pauses: list[float] = []
    run_cas(attempt, Retry(5, base=0.001, cap=0.05), TryAgainLater("x"), sleep=pauses.append)
    assert pauses == [0.001, 0.002, 0.004]


def test_jitter_draws_within_the_bound():
    retry = Retry(4, base=0.01, jitter=True)
    draws = [retry.pause(3, rand=lambda lo, hi: hi) for _ in range(2)]
    assert draws == [0.04, 0.04] and retry.pause(3, rand=lambda lo, hi: lo) == 0.0


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.integers(0, 20),
    st.builds(
        Retry,
        st.integers(1, 12),
        st.floats(0, 1),
        st.floats(0, 2),
        st.booleans(),
        st.booleans(),
        st.integers(0, 3),
    ),
)
def test_any_retry_policy_keeps_its_bounds(losses, retry):
    """Whatever the policy and however often the compare is lost: at most ``attempts``
    attempts, the first win returned, one conflict counted per loss, one retry per later
    attempt, every pause within [0, cap] and within its bound, and the loop's error at the end."""
    attempt, calls = lose(losses)
    pauses: list[float] = []
    counts = {"conflict": 0, "retry": 0}

    def count(name):
        return lambda: counts.__setitem__(name, counts[name] + 1)

    try:
        result = run_cas(
            attempt,
            retry,
            TryAgainLater("gave up"),
            sleep=pauses.append,
            on_conflict=count("conflict"),
            on_retry=count("retry"),
        )
    except TryAgainLater:
        assert losses >= retry.attempts and len(calls) == retry.attempts
    else:
        assert result == "done" and losses < retry.attempts and len(calls) == losses + 1
    assert counts == {"conflict": min(losses, retry.attempts), "retry": len(calls) - 1}
    longest = max((retry.bound(n) for n in range(1, retry.attempts)), default=0.0)
    assert all(0 < p <= min(retry.cap, longest) for p in pauses)
    assert len(pauses) <= len(calls) - 1

"""One compare-and-swap retry for every txn loop over a ``Store``.

A CAS loop reads some keys, plans a txn comparing their ``mod_revision`` and commits it; a lost
compare means another writer was first, so it reads and plans again, a bounded number of
times with a pause in between. ``run_cas(attempt, retry, give_up)`` is that loop: ``attempt()``
returns its result, or ``LOST`` when its txn lost a compare (having re-read what it needs);
``retry`` (a ``Retry``) holds the loop's limits as named parameters; ``give_up`` is the error
raised when every attempt lost (or a callable whose value is returned instead: the lease
combiner hands its callers their own errors). ``on_conflict`` counts each lost attempt,
``on_retry`` each further one (the lease metrics).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


class Lost:
    """What an attempt returns when its txn lost a compare."""

    def __repr__(self) -> str:
        return "LOST"


LOST = Lost()


def _noop() -> None:
    return None


#: The retries' own random source (not the random module's shared one, which a test
#: framework may reseed or watch).
JITTER = random.Random()


@dataclass(frozen=True)
class Retry:
    """``attempts`` in all. Before the n-th retry (n = 1, 2 ...) a pause of at most ``base``,
    doubled for each later retry (``linear``: ``base`` times the retry's number instead) and
    capped at ``cap``; with ``jitter`` drawn uniformly from [0, that]. The first ``immediate``
    retries do not pause (the keys they lost on were just re-read)."""

    attempts: int
    base: float = 0.0
    cap: float = math.inf
    jitter: bool = False
    linear: bool = False
    immediate: int = 0

    def bound(self, retry: int) -> float:
        """The longest pause before retry number ``retry``."""
        step = retry - self.immediate
        if step <= 0 or self.base <= 0:
            return 0.0
        return min(self.cap, self.base * step if self.linear else self.base * 2 ** (step - 1))

    def pause(self, retry: int, rand: Callable[[float, float], float] | None = None) -> float:
        bound = self.bound(retry)
        uniform = rand or JITTER.uniform
        return uniform(0.0, bound) if self.jitter and bound > 0 else bound


def run_cas(
    attempt: Callable[[], T | Lost],
    retry: Retry,
    give_up: BaseException | Callable[[], T],
    *,
    on_conflict: Callable[[], None] = _noop,
    on_retry: Callable[[], None] = _noop,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``attempt`` until it does not return ``LOST``, at most ``retry.attempts`` times."""
    for number in range(retry.attempts):
        if number:
            on_retry()
            pause = retry.pause(number)
            if pause > 0:
                sleep(pause)
        result = attempt()
        if not isinstance(result, Lost):
            return result
        on_conflict()
    if isinstance(give_up, BaseException):
        raise give_up
    return give_up()

"""A per-thread cap on each store call, for requests that must answer in time.

A CNI ADD must answer within a few seconds even when etcd is gone (the outage tests in
tests/liveness hold its code 11 under 3 s), while the store's own ``requestTimeout`` (2.5 s) is
made for background work.
``call_budget(s)`` caps every store call this thread makes inside the block at ``s`` seconds
(a store that honours it: ``EtcdStore`` through ``bound()``); nested caps keep the smaller.
It caps each call, not the request as a whole: time spent queued behind other requests of the
node (the lease service combines them) is not the store's fault and must not turn a busy but
healthy etcd into an "unreachable" one. The cap also marks the thread as serving a request
(``in_request``), so a store known to be down can fail such calls at once
(``ipam.outage.store``). Threads never see each other's cap.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


@contextmanager
def call_budget(seconds: float) -> Iterator[None]:
    """Each store call made by this thread inside the block takes at most ``seconds``."""
    outer = getattr(_local, "budget", None)
    _local.budget = seconds if outer is None else min(outer, seconds)
    try:
        yield
    finally:
        _local.budget = outer


def current_budget() -> float | None:
    return getattr(_local, "budget", None)


def in_request() -> bool:
    return current_budget() is not None


def bound(budget: float) -> float:
    """``budget`` cut down to this thread's cap."""
    cap = current_budget()
    return budget if cap is None else min(budget, cap)

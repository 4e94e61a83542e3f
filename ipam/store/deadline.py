"""A per-thread deadline for store calls: "everything this request asks the store ends by T".

A CNI ADD must answer within a few seconds even when etcd is gone (issue 3: code 11 within
3 s), yet one ADD makes several store calls, each with its own timeout. ``call_deadline(s)``
bounds them together: a store that honours it (``EtcdStore`` through ``remaining()``) gives
each call only the time left, and a call started after the deadline fails at once with
``TryAgainLater``. Nested deadlines keep the earliest. Threads never see each other's.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

_local = threading.local()


@contextmanager
def call_deadline(seconds: float) -> Iterator[None]:
    """Store calls made by this thread inside the block end within ``seconds``."""
    outer = getattr(_local, "deadline", None)
    mine = time.monotonic() + seconds
    _local.deadline = mine if outer is None else min(outer, mine)
    try:
        yield
    finally:
        _local.deadline = outer


def remaining() -> float | None:
    """Seconds left before this thread's deadline (may be <= 0); None without a deadline."""
    deadline = getattr(_local, "deadline", None)
    return None if deadline is None else deadline - time.monotonic()


def bound(budget: float) -> float:
    """``budget`` cut down to this thread's deadline (never below 0)."""
    left = remaining()
    return budget if left is None else max(0.0, min(budget, left))

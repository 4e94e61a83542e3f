"""A Store wrapper that notices when the store is unreachable.

``TrackedStore`` passes every call through. A ``TryAgainLater`` from the store itself (etcd
unreachable, overloaded or closed: raised by the store, not by a caller's retry loop) comes out
as ``StoreUnreachable`` (still code 11) and makes the store *suspect*: ``on_suspect`` asks for
a ``status()`` probe at once. Only a failed probe marks ``Reachability`` down, so one call that
missed its budget on a busy but healthy etcd does not divert every request; any call that
succeeds marks the store up again. While it is down, calls made on
behalf of a CNI request (a thread inside ``store.deadline.call_budget``) fail at once
without touching the store, so only the first ADD of an outage waits for a timeout (the other
threads, e.g. the reconciler's probe, still ask the store).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from cni.spec.errors import NotAvailable, TryAgainLater
from store import deadline
from store.base import KV, Compare, Op, Store, TxnResult

T = TypeVar("T")
DOWN_HOLD = 10.0  # a down mark expires by itself, should nobody probe the store again


class StoreUnreachable(TryAgainLater):
    """The store did not answer (code 11): the outage path may take over."""


class Reachability:
    """``suspect`` after a failed call, ``down`` after a failed probe; both end when a call
    succeeds again."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._down_until = 0.0
        self.suspect = False
        self.reason = ""
        self.changed = threading.Event()  # set on every down -> up transition
        self.on_suspect: Callable[[], None] = lambda: None  # e.g. wake the prober

    @property
    def down(self) -> bool:
        return self.clock() < self._down_until

    def failed(self, reason: str) -> None:
        """A call got no answer: probe before believing it."""
        self.reason, self.suspect = reason, True
        self.on_suspect()

    def probe_failed(self, reason: str) -> None:
        self.reason, self.suspect = reason, True
        self._down_until = self.clock() + DOWN_HOLD

    def succeeded(self) -> None:
        self.suspect = False
        if self._down_until:
            self._down_until = 0.0
            self.changed.set()


class TrackedStore:
    """``Store`` over another store, reporting reachability; other attributes pass through."""

    def __init__(self, store: Store, reach: Reachability | None = None) -> None:
        self.inner = store
        self.reach = reach or Reachability()
        self.name = store.name

    def _call(self, what: str, call: Callable[[], T]) -> T:
        if self.reach.down and deadline.in_request():
            raise StoreUnreachable(
                f"the store {self.name} is unreachable", self.reach.reason or f"{what} not tried"
            )
        try:
            result = call()
        except TryAgainLater as exc:
            self.reach.failed(str(exc))
            raise StoreUnreachable(exc.msg, exc.details) from None
        self.reach.succeeded()
        return result

    def get(self, key: str) -> KV | None:
        return self._call("get", lambda: self.inner.get(key))

    def range(self, prefix: str, *, keys_only: bool = False, limit: int = 0) -> list[KV]:
        return self._call(
            "range", lambda: self.inner.range(prefix, keys_only=keys_only, limit=limit)
        )

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        return self._call("txn", lambda: self.inner.txn(compares, ops))

    def revision(self) -> int:
        return self._call("revision", self.inner.revision)

    def status(self) -> None:
        try:
            self.inner.status()
        except NotAvailable as exc:
            self.reach.probe_failed(str(exc))
            raise
        self.reach.succeeded()

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # leases, watches, compaction ...
        return getattr(self.inner, name)

"""A Store wrapper that notices when the store is unreachable, and bounds calls by a deadline.

``TrackedStore`` passes every call through. A ``TryAgainLater`` from the store itself (etcd
unreachable, overloaded or closed: raised by the store, not by a caller's retry loop) comes out
as ``StoreUnreachable`` (still code 11) and marks ``Reachability`` down; ``status()`` failing
marks it down too, and any call that succeeds marks it up. While it is down the outage guard
serves ADDs without touching the store, so only the first ADD of an outage waits for a
timeout. A call started after this thread's deadline (``ipam.store.deadline``) fails at once
(``StoreUnreachable``, without marking the store down: it answered, only too slowly).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence, TypeVar

from cni.spec.errors import NotAvailable, TryAgainLater
from ipam.store import deadline
from ipam.store.base import KV, Compare, Op, Store, TxnResult

T = TypeVar("T")
DOWN_HOLD = 10.0  # a down mark expires by itself, should nobody probe the store again


class StoreUnreachable(TryAgainLater):
    """The store did not answer (code 11): the outage path may take over."""


class Reachability:
    """Whether the store answered last time; ``down`` until a call succeeds again."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._down_until = 0.0
        self.reason = ""
        self.changed = threading.Event()  # set on every down -> up transition

    @property
    def down(self) -> bool:
        return self.clock() < self._down_until

    def failed(self, reason: str) -> None:
        self._down_until = self.clock() + DOWN_HOLD
        self.reason = reason

    def succeeded(self) -> None:
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
        left = deadline.remaining()
        if left is not None and left <= 0:  # slow, not down: no mark
            raise StoreUnreachable(f"the store {self.name} did not answer in time",
                                   f"the request's deadline passed before the {what}")
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
        return self._call("range", lambda: self.inner.range(prefix, keys_only=keys_only,
                                                            limit=limit))

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        return self._call("txn", lambda: self.inner.txn(compares, ops))

    def revision(self) -> int:
        return self._call("revision", self.inner.revision)

    def status(self) -> None:
        try:
            self.inner.status()
        except NotAvailable as exc:
            self.reach.failed(str(exc))
            raise
        self.reach.succeeded()

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # leases, watches, compaction ...
        return getattr(self.inner, name)

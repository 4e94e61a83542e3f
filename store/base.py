"""The Store protocol: a revisioned key-value space with compare-and-swap transactions.

It is the subset of etcd v3 that pycni needs, so etcd implements it directly and the embedded
SQLite store mimics it (one global revision counter, ``mod_revision`` per key). Every write in
pycni is a ``txn`` that compares the ``mod_revision`` of each key it read (0 = must be absent),
so no two writers can both win (docs/store-layout.md, "Keys written together").

Errors: a store that cannot be reached raises ``cni.spec.errors.TryAgainLater`` (code 11)
naming the store; ``status()`` raises ``NotAvailable`` (code 50) instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

PREFIX = "/pycni/v1/"


@dataclass(frozen=True)
class KV:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int = 0


@dataclass(frozen=True)
class Compare:
    """Succeeds when ``key``'s mod_revision equals ``mod_revision`` (0: key must not exist)."""

    key: str
    mod_revision: int


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    lease: int = 0  # etcd lease id; 0 = none (SQLite ignores leases it does not know)


@dataclass(frozen=True)
class Delete:
    key: str
    prefix: bool = False


Op = Put | Delete


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store revision after the txn (or at the failed compare)


class Store(Protocol):
    name: str  # for messages: "sqlite:/var/lib/pycni/store.db", "etcd:https://10.0.0.1:2379"

    def get(self, key: str) -> KV | None: ...

    def range(self, prefix: str, *, keys_only: bool = False, limit: int = 0) -> list[KV]:
        """All keys starting with ``prefix``, sorted by key (values empty if keys_only)."""

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        """Apply every op atomically iff every compare holds."""

    def revision(self) -> int: ...

    def status(self) -> None:
        """Raise NotAvailable (code 50) when the store cannot serve writes now."""

    def close(self) -> None: ...


def change_counter(store: Store) -> Callable[[], int] | None:
    """The store's ``data_version`` when it has one (SQLite): a number that changes whenever
    another writer committed, never for this store object's own txns. None otherwise (etcd:
    another writer's change is learned from a watch or a lost compare)."""
    counter = getattr(store, "data_version", None)
    return counter if callable(counter) else None

"""A view kept current from store prefixes: read each prefix once, then watch it from the
revision read (etcd); a store without watches (SQLite) is looked at by ``ensure`` whenever its
revision moved (every ``ensure`` if it has none), so its owner polls ``ensure`` instead, and
is asked to give back what it cached for a whole read (``SqliteStore.release_cache``). Once
read whole, such a store that can tell what changed since a revision (``SqliteStore
.changes_since``) gives only the keys written since and the keys deleted: a Pod's ADD then
costs its own records, not a re-read of 10,000 (2 s measured at 10k endpoints + 1k policies).

Both of pycnid's syncs (overlay peers, Service proxy) keep their in-memory view this way. The
view has ``replace_all(kvs, prefix)`` (a snapshot of one prefix: after a read, or a watch that
resumed past compaction; an etcd read comes page by page, so ``kvs`` is consumed once, as it
arrives) and ``apply(kv, deleted)``; changes are made under ``lock`` and then
``on_change(changed)`` is called (``changed``: what ``apply`` returned, True for a snapshot).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence, Set
from typing import TYPE_CHECKING, Protocol, TypeGuard

from store.base import KV, Store

if TYPE_CHECKING:
    from store.etcd_watch import Watch, WatchingStore, WatchUpdate


class View(Protocol):
    """What the owner keeps current (see the module docstring)."""

    def replace_all(self, kvs: Iterable[KV], prefix: str) -> None: ...

    def apply(self, kv: KV, deleted: bool) -> object: ...


class PagedLister(Protocol):
    """A store that reads a prefix page by page at one revision (``EtcdStore.range_pages``)."""

    def range_pages(self, prefix: str) -> tuple[Iterable[KV], int]: ...


class ChangeReader(Protocol):
    """A store without watches that tells the writes since a revision (``SqliteStore``)."""

    def changes_since(
        self, prefix: str, revision: int, known: Set[str]
    ) -> tuple[list[KV], set[str] | None]: ...


def can_read_changes(store: object) -> TypeGuard[ChangeReader]:
    return callable(getattr(store, "changes_since", None))


def can_watch(store: Store) -> TypeGuard[WatchingStore]:
    return callable(getattr(store, "watch", None))


def can_page(store: object) -> TypeGuard[PagedLister]:
    return callable(getattr(store, "range_pages", None))


class WatchedPrefixes:
    def __init__(
        self,
        store: Store,
        prefixes: Sequence[str],
        view: View,
        lock: threading.Lock,
        on_change: Callable[[bool], None],
    ) -> None:
        self.store, self.prefixes, self.view, self.lock = store, tuple(prefixes), view, lock
        self.on_change = on_change
        self.loaded: set[str] = set()
        self.watches: list[Watch] = []
        self.read_at: int | None = None  # without watches: the store revision last read
        self.keys: dict[str, set[str]] = {}  # without watches: each prefix's keys last read

    @property
    def can_watch(self) -> bool:
        return can_watch(self.store)

    def ensure(self) -> None:
        """Read every prefix not yet watched (without watches: all of them, if the store
        changed since the last read)."""
        watching = self.store if can_watch(self.store) else None
        revision = None if watching is not None else self._revision()
        if watching is None and revision is not None and revision == self.read_at:
            return
        if watching is None and self.read_changes(revision):
            return
        whole = False
        for prefix in self.prefixes:
            if prefix in self.loaded:
                continue
            whole = True
            kvs: Iterable[KV]
            if watching is None:
                kvs, read = self.noting_keys(prefix, self.store.range(prefix)), 0
            elif can_page(watching):  # the view takes it page by page, under the lock
                kvs, read = watching.range_pages(prefix)
            else:
                kvs, read = watching.range_at(prefix)
            with self.lock:
                self.view.replace_all(kvs, prefix)
            if watching is not None:
                self.watches.append(watching.watch(prefix, read + 1, self.on_update_of(prefix)))
                self.loaded.add(prefix)
        self.read_at = revision  # after a whole read; a txn in between: read again next call
        release = getattr(self.store, "release_cache", None)
        if whole and callable(release):
            release()  # what the store cached for the whole read (``SqliteStore``)

    def read_changes(self, revision: int | None) -> bool:
        """Bring the view from ``read_at`` to ``revision`` with the keys written and deleted
        since (True); False when the store cannot tell (a whole read is due)."""
        after = self.read_at
        if revision is None or after is None or revision < after:
            return False
        if not can_read_changes(self.store) or set(self.keys) != set(self.prefixes):
            return False
        for prefix in self.prefixes:
            known = self.keys[prefix]
            changed, keys = self.store.changes_since(prefix, after, known)
            gone = known - keys if keys is not None else set()
            with self.lock:
                for kv in changed:
                    self.view.apply(kv, False)
                for key in sorted(gone):
                    self.view.apply(KV(key, b"", 0), True)
            if keys is not None:
                self.keys[prefix] = keys
            else:  # nothing deleted: the keys written join, in place (no copy of 10,000)
                known.update(kv.key for kv in changed)
        self.read_at = revision  # a txn after ``revision``: applied now and again next call
        return True

    def noting_keys(self, prefix: str, kvs: Iterable[KV]) -> Iterable[KV]:
        """``kvs`` as they come, their keys kept as the prefix's (``read_changes``)."""
        keys: set[str] = set()
        for kv in kvs:
            keys.add(kv.key)
            yield kv
        self.keys[prefix] = keys

    def _revision(self) -> int | None:
        revision = getattr(self.store, "revision", None)
        return revision() if callable(revision) else None

    def on_update_of(self, prefix: str) -> Callable[[WatchUpdate], None]:
        def on_update(update: WatchUpdate) -> None:
            with self.lock:
                if update.snapshot:
                    self.view.replace_all([e.kv for e in update.events], prefix)
                    changed = True
                else:
                    changed = any(
                        [bool(self.view.apply(e.kv, e.kind == "delete")) for e in update.events]
                    )
            self.on_change(changed)

        return on_update

    def cancel(self) -> None:
        for watch in self.watches:
            watch.cancel()

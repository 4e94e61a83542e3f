"""WatchedPrefixes over a store without watches (SQLite): generated runs of txns and
``ensure`` calls keep the view equal to the store's prefixes after every ``ensure``, and the
store is read again exactly when its revision moved (a txn that changes nothing, such as the
delete of an absent key, does not move it) (store/watched.py)."""

from __future__ import annotations

import tempfile
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from store.base import Delete, Put
from store.sqlite import SqliteStore
from store.watched import WatchedPrefixes

PREFIXES = ("/a/", "/b/")
KEYS = st.sampled_from([f"{p}{k}" for p in PREFIXES for k in "xyz"] + ["/c/x"])
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, st.binary(max_size=3)),
        st.tuples(st.just("delete"), KEYS, st.just(b"")),
        st.tuples(st.just("ensure"), st.just(""), st.just(b"")),
    ),
    max_size=12,
)


class View:
    """The view a sync keeps: key -> value, fed by snapshots (no watch: only those)."""

    def __init__(self) -> None:
        self.kvs: dict[str, bytes] = {}

    def replace_all(self, kvs, prefix: str) -> None:
        self.kvs = {k: v for k, v in self.kvs.items() if not k.startswith(prefix)}
        self.kvs.update({kv.key: kv.value for kv in kvs})

    def apply(self, kv, deleted: bool = False) -> None:
        raise AssertionError("a store without watches delivers no events")


class CountingStore(SqliteStore):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.reads = 0

    def range(self, prefix: str, **kw):
        self.reads += 1
        return super().range(prefix, **kw)


def contents(store: SqliteStore) -> dict[str, bytes]:
    return {kv.key: kv.value for p in PREFIXES for kv in SqliteStore.range(store, p)}


@settings(max_examples=60, deadline=None)
@given(STEPS)
def test_ensure_reads_again_exactly_when_the_store_moved(steps):
    with tempfile.TemporaryDirectory() as tmp:
        store, view = CountingStore(f"{tmp}/s.db"), View()
        watched = WatchedPrefixes(store, PREFIXES, view, threading.Lock(), lambda _c: None)
        assert not watched.can_watch
        watched.ensure()
        read_at = store.revision()
        for verb, key, value in steps:
            if verb == "ensure":
                reads, moved = store.reads, store.revision() != read_at
                watched.ensure()
                assert store.reads - reads == (len(PREFIXES) if moved else 0)
                assert view.kvs == contents(store)
                read_at = store.revision()
            else:
                store.txn([], [Put(key, value) if verb == "put" else Delete(key)])
        store.close()

"""WatchedPrefixes over a store without watches (SQLite): generated runs of txns (by pycnid's
connection and by another one to the same file, as the CLI writes) and ``ensure`` calls keep
the view equal to the store's prefixes after every ``ensure``. The store is read whole once
(and then asked to give its page cache back);
after that it is asked what changed exactly when its revision moved (a txn that changes
nothing, such as the delete of an absent key, does not move it), and the view gets only those
puts and deletes; a store that cannot tell what changed is read whole again
(store/watched.py)."""

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
        st.tuples(st.sampled_from(["put", "put by another"]), KEYS, st.binary(max_size=3)),
        st.tuples(st.sampled_from(["delete", "delete by another"]), KEYS, st.just(b"")),
        st.tuples(st.just("ensure"), st.just(""), st.just(b"")),
    ),
    max_size=12,
)


class View:
    """The view a sync keeps: key -> value, fed by snapshots and single puts and deletes."""

    def __init__(self) -> None:
        self.kvs: dict[str, bytes] = {}
        self.applied = 0

    def replace_all(self, kvs, prefix: str) -> None:
        self.kvs = {k: v for k, v in self.kvs.items() if not k.startswith(prefix)}
        self.kvs.update({kv.key: kv.value for kv in kvs})

    def apply(self, kv, deleted: bool = False) -> None:
        self.applied += 1
        if deleted:
            assert kv.key in self.kvs, f"a delete of {kv.key}, which the view does not hold"
            del self.kvs[kv.key]
        else:
            self.kvs[kv.key] = kv.value


class CountingStore(SqliteStore):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.reads = self.asked = self.released = 0

    def release_cache(self) -> None:
        self.released += 1
        super().release_cache()

    def range(self, prefix: str, **kw):
        self.reads += 1
        return super().range(prefix, **kw)

    def changes_since(self, prefix: str, revision: int, known):
        self.asked += 1
        return super().changes_since(prefix, revision, known)


class WholeStore(CountingStore):
    """A store without watches that cannot tell what changed: read whole every time."""

    changes_since = None  # type: ignore[assignment]


def contents(store: SqliteStore) -> dict[str, bytes]:
    return {kv.key: kv.value for p in PREFIXES for kv in SqliteStore.range(store, p)}


@settings(max_examples=60, deadline=None)
@given(STEPS, st.booleans())
def test_ensure_reads_what_changed_exactly_when_the_store_moved(steps, tells):
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/s.db"
        store, view = (CountingStore if tells else WholeStore)(path), View()
        other = SqliteStore(path)
        watched = WatchedPrefixes(store, PREFIXES, view, threading.Lock(), lambda _c: None)
        assert not watched.can_watch
        watched.ensure()
        assert (store.reads, view.applied, store.released) == (len(PREFIXES), 0, 1)
        read_at = store.revision()
        for verb, key, value in steps:
            if verb == "ensure":
                reads, asked, moved = store.reads, store.asked, store.revision() != read_at
                released = store.released
                watched.ensure()
                whole, changes = (0, len(PREFIXES)) if tells else (len(PREFIXES), 0)
                assert store.reads - reads == (whole if moved else 0)
                assert store.asked - asked == (changes if moved else 0)
                # the page cache given back after each whole read, not after a read of changes
                assert store.released - released == (1 if moved and not tells else 0)
                assert view.kvs == contents(store)
                read_at = store.revision()
            else:
                writer = other if verb.endswith("by another") else store
                writer.txn([], [Put(key, value) if verb.startswith("put") else Delete(key)])
        if not tells:
            assert view.applied == 0
        other.close()
        store.close()

"""A prefix snapshot handed to the proxy's records as it is read (``Records.replace_all`` over a
one-shot iterator: etcd's pages at a restart, ``EtcdStore.range_pages``): for generated records
before and generated snapshots (kept, changed, new, gone, unreadable), the records, their indexes
and parsed addresses end exactly as records built from the final state, and every Service whose
endpoints changed is dirty."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.proxy.view import SMALL, Records, _index, _unindex
from store.keys import ENDPOINTS, SERVICES
from tests.unit.test_proxy_view import endpoints, kv, records_of, services

SVCS = st.lists(st.sampled_from("abc").flatmap(services), max_size=3, unique_by=lambda s: s.name)
EPS = st.lists(endpoints(), max_size=6, unique_by=lambda e: e.key)


def state(records: Records) -> tuple:
    return (
        records.services,
        records.endpoints,
        records.addresses,
        records.labelled,
        records.selecting,
        +records.vips,
        set(records.bad.keys),
    )


@settings(max_examples=200, deadline=None, database=None)
@given(
    svcs=SVCS,
    before=EPS,
    after=EPS,
    corrupt=st.booleans(),
    services_snapshot=SVCS,
)
def test_a_snapshot_read_as_it_comes_leaves_what_a_fresh_read_gives(
    svcs, before, after, corrupt, services_snapshot
):
    records = records_of(svcs, before)
    records.take_dirty()
    snapshot = [kv(e.key, e.to_bytes()) for e in after]
    if corrupt:
        snapshot.append(kv(f"{ENDPOINTS}ns/bad/eth0", b"{not json"))
    records.replace_all(iter(snapshot), ENDPOINTS)  # one pass over it, as pages arrive
    records.replace_all(iter([kv(s.key, s.to_bytes()) for s in services_snapshot]), SERVICES)
    fresh = records_of(services_snapshot, after)
    if corrupt:
        fresh.apply(kv(f"{ENDPOINTS}ns/bad/eth0", b"{not json"))
    assert state(records) == state(fresh)
    dirty = records.take_dirty()
    old, new = {e.key: e for e in before}, {e.key: e for e in after}
    changed = [e for k in old.keys() | new.keys() for e in (old.get(k), new.get(k)) if e]
    changed = [e for e in changed if old.get(e.key) != new.get(e.key)]
    for svc in services_snapshot:
        if svc in svcs and any(
            e.namespace == svc.namespace
            and svc.selector
            and all(e.labels.get(k) == v for k, v in svc.selector.items())
            for e in changed
        ):
            assert svc.key in dirty
    assert {s.key for s in services_snapshot if s not in svcs} <= dirty


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.sampled_from([("ns", "app", "a"), ("ns", "app", "b"), ("o", "tier", "a")]),
            st.integers(0, 19).map(lambda i: f"k{i}"),
        ),
        max_size=120,
    )
)
def test_an_index_entry_holds_its_keys_in_one_form_for_each_size(ops):
    """Adds and removes under label pairs, in any order: an entry holds exactly its keys, as a
    sorted tuple up to SMALL and a set above (so equal contents are equal entries), and an
    entry with none is gone."""
    index: dict = {}
    model: dict = {}
    for add, pair, key in ops:
        (_index if add else _unindex)(index, [pair], key)
        keys = model.setdefault(pair, set())
        (keys.add if add else keys.discard)(key)
    for pair, keys in model.items():
        if not keys:
            assert pair not in index
        elif len(keys) <= SMALL:
            assert index[pair] == tuple(sorted(keys))
        else:
            assert index[pair] == keys and isinstance(index[pair], set)

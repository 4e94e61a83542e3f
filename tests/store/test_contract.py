"""The Store contract (store/base.py): every implementation must pass all of it.

Runs against each `store` param of conftest.py (SQLite; etcd on a real server). Tests only
use keys under their own `ns` prefix and never assume they are the only writer of the
revision counter.
"""

from __future__ import annotations

import threading

from store.base import KV, Compare, Delete, Put, TxnResult


def put(store, key: str, value: bytes, rev: int | None = None) -> TxnResult:
    compares = [] if rev is None else [Compare(key, rev)]
    return store.txn(compares, [Put(key, value)])


def test_get_missing_key_is_none(store, ns):
    assert store.get(ns + "nothing") is None


def test_put_creates_key_at_the_txn_revision(store, ns):
    before = store.revision()
    result = put(store, ns + "a", b"1")
    assert result.succeeded and result.revision > before
    kv = store.get(ns + "a")
    assert kv == KV(ns + "a", b"1", result.revision, result.revision)
    assert store.revision() >= result.revision


def test_update_bumps_mod_revision_keeps_create_revision(store, ns):
    first = put(store, ns + "a", b"1")
    second = put(store, ns + "a", b"2")
    assert second.revision > first.revision
    kv = store.get(ns + "a")
    assert (kv.value, kv.mod_revision, kv.create_revision) == (
        b"2",
        second.revision,
        first.revision,
    )


def test_values_are_opaque_bytes(store, ns):
    blob = bytes(range(256)) + "ünïcode".encode()
    put(store, ns + "bin", blob)
    assert store.get(ns + "bin").value == blob


def test_keys_with_ipv6_colons_and_dashes(store, ns):
    key = ns + "blocks/net-fd00::-64/fd00::40-122"
    put(store, key, b"x")
    assert store.get(key).value == b"x"
    assert [kv.key for kv in store.range(ns + "blocks/net-fd00::-64/")] == [key]


def test_compare_absent_creates_only_once(store, ns):
    assert put(store, ns + "k", b"first", rev=0).succeeded
    lost = put(store, ns + "k", b"second", rev=0)
    assert not lost.succeeded
    assert store.get(ns + "k").value == b"first"


def test_compare_mod_revision_wins_only_with_the_current_revision(store, ns):
    created = put(store, ns + "k", b"1")
    assert put(store, ns + "k", b"2", rev=created.revision).succeeded
    stale = put(store, ns + "k", b"3", rev=created.revision)
    assert not stale.succeeded
    assert store.get(ns + "k").value == b"2"


def test_failed_txn_reports_a_current_revision(store, ns):
    created = put(store, ns + "k", b"1")
    result = put(store, ns + "k", b"2", rev=0)
    assert not result.succeeded and result.revision >= created.revision


def test_failed_compare_applies_no_op_at_all(store, ns):
    put(store, ns + "guard", b"g")
    put(store, ns + "victim", b"v")
    result = store.txn(
        [Compare(ns + "guard", 0)],
        [Put(ns + "new", b"n"), Delete(ns + "victim"), Put(ns + "guard", b"x")],
    )
    assert not result.succeeded
    assert store.get(ns + "new") is None
    assert store.get(ns + "victim").value == b"v"
    assert store.get(ns + "guard").value == b"g"


def test_every_compare_must_hold(store, ns):
    a = put(store, ns + "a", b"1")
    b = put(store, ns + "b", b"1")
    ok = [Compare(ns + "a", a.revision), Compare(ns + "b", b.revision), Compare(ns + "c", 0)]
    assert not store.txn([*ok[:2], Compare(ns + "c", 99)], [Put(ns + "c", b"no")]).succeeded
    assert store.get(ns + "c") is None
    assert store.txn(ok, [Put(ns + "c", b"yes")]).succeeded


def test_multi_key_txn_is_atomic_and_shares_one_revision(store, ns):
    result = store.txn(
        [Compare(ns + "x", 0), Compare(ns + "y", 0)], [Put(ns + "x", b"1"), Put(ns + "y", b"2")]
    )
    assert result.succeeded
    assert store.get(ns + "x").mod_revision == store.get(ns + "y").mod_revision == result.revision


def test_compare_only_txn_succeeds_without_writing(store, ns):
    created = put(store, ns + "k", b"1")
    result = store.txn([Compare(ns + "k", created.revision)], [])
    assert result.succeeded
    assert store.get(ns + "k").mod_revision == created.revision


def test_delete_key_then_it_compares_as_absent(store, ns):
    created = put(store, ns + "k", b"1")
    assert store.txn([Compare(ns + "k", created.revision)], [Delete(ns + "k")]).succeeded
    assert store.get(ns + "k") is None
    assert put(store, ns + "k", b"again", rev=0).succeeded


def test_delete_missing_key_succeeds(store, ns):
    assert store.txn([], [Delete(ns + "ghost")]).succeeded


def test_recreated_key_gets_a_new_create_revision(store, ns):
    first = put(store, ns + "k", b"1")
    store.txn([], [Delete(ns + "k")])
    again = put(store, ns + "k", b"2")
    assert store.get(ns + "k").create_revision == again.revision > first.revision


def test_delete_prefix_removes_only_that_prefix(store, ns):
    for key in ("h/net/c1/eth0", "h/net/c1/eth1", "h/net/c10/eth0", "h/net2/c1/eth0"):
        put(store, ns + key, b"x")
    store.txn([], [Delete(ns + "h/net/c1/", prefix=True)])
    assert [kv.key for kv in store.range(ns)] == [ns + "h/net/c10/eth0", ns + "h/net2/c1/eth0"]


def test_range_is_sorted_by_key_and_prefix_bounded(store, ns):
    for key in ("b/2", "a/1", "b/10", "b/1", "c", "b"):
        put(store, ns + key, key.encode())
    found = store.range(ns + "b/")
    assert [kv.key for kv in found] == [ns + "b/1", ns + "b/10", ns + "b/2"]
    assert [kv.value for kv in found] == [b"b/1", b"b/10", b"b/2"]
    assert store.range(ns + "zzz") == []


def test_range_keys_only_and_limit(store, ns):
    revs = {k: put(store, ns + k, b"value").revision for k in ("1", "2", "3")}
    keys = store.range(ns, keys_only=True)
    assert [(kv.key, kv.value) for kv in keys] == [(ns + k, b"") for k in ("1", "2", "3")]
    assert [kv.mod_revision for kv in keys] == [revs["1"], revs["2"], revs["3"]]
    assert [kv.key for kv in store.range(ns, limit=2)] == [ns + "1", ns + "2"]


def test_revision_never_goes_back(store, ns):
    seen = [store.revision()]
    for i in range(5):
        put(store, ns + str(i), b"x")
        seen.append(store.revision())
    assert seen == sorted(seen) and seen[-1] > seen[0]


def test_status_is_quiet_when_healthy(store):
    assert store.status() is None


def test_name_says_which_store(store):
    assert isinstance(store.name, str) and ":" in store.name


def cas_increment(store, key: str, times: int, retries: list[int]) -> None:
    for _ in range(times):
        while True:
            kv = store.get(key)
            value = int(kv.value) + 1 if kv else 1
            if store.txn(
                [Compare(key, kv.mod_revision if kv else 0)], [Put(key, str(value).encode())]
            ).succeeded:
                break
            retries.append(1)


def test_concurrent_cas_increments_lose_no_update(store, ns):
    threads_n, times = 8, 40
    retries: list[int] = []
    threads = [
        threading.Thread(target=cas_increment, args=(store, ns + "counter", times, retries))
        for _ in range(threads_n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert int(store.get(ns + "counter").value) == threads_n * times


def claim_first_free(store, prefix: str, slots: int, winners: list[str], me: str) -> None:
    for slot in range(slots):
        if store.txn(
            [Compare(f"{prefix}{slot:03d}", 0)], [Put(f"{prefix}{slot:03d}", me.encode())]
        ).succeeded:
            winners.append(f"{slot:03d}")
            return


def test_create_if_absent_race_has_one_winner_per_key(store, ns):
    winners: list[str] = []
    threads = [
        threading.Thread(target=claim_first_free, args=(store, ns, 20, winners, f"t{i}"))
        for i in range(12)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 12 and len(set(winners)) == 12
    owners = {kv.key: kv.value for kv in store.range(ns)}
    assert len(owners) == 12 and len(set(owners.values())) == 12

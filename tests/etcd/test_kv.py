"""Store semantics on a real etcd: get/range/txn, compare-and-swap, create-if-absent, prefixes."""

from __future__ import annotations

import threading

import pytest

from cni.spec.errors import InternalError, InvalidConfig
from store.base import Compare, Delete, Put
from store.etcd import EtcdStore

pytestmark = pytest.mark.etcd


def test_get_missing_key_is_none(store):
    assert store.get("/pycni/v1/nothing") is None
    assert store.name == f"etcd:{store.options.endpoints[0]}"


def test_create_if_absent_wins_once(store):
    first = store.txn([Compare("/k", 0)], [Put("/k", b"one")])
    second = store.txn([Compare("/k", 0)], [Put("/k", b"two")])
    assert first.succeeded and not second.succeeded
    assert second.revision == first.revision  # nothing written by the failed txn
    kv = store.get("/k")
    assert (kv.value, kv.mod_revision, kv.create_revision) == (
        b"one",
        first.revision,
        first.revision,
    )


def test_cas_on_mod_revision(store):
    created = store.txn([Compare("/k", 0)], [Put("/k", b"v1")])
    updated = store.txn([Compare("/k", created.revision)], [Put("/k", b"v2")])
    stale = store.txn([Compare("/k", created.revision)], [Put("/k", b"v3")])
    assert updated.succeeded and not stale.succeeded
    kv = store.get("/k")
    assert kv.value == b"v2" and kv.mod_revision == updated.revision
    assert kv.create_revision == created.revision


def test_txn_is_all_or_nothing_across_keys(store):
    store.txn([], [Put("/a", b"1"), Put("/b", b"1")])
    a, b = store.get("/a"), store.get("/b")
    bumped = store.txn([], [Put("/b", b"2")])
    # one stale compare: no op is applied, not even the ones on keys that matched
    result = store.txn(
        [Compare("/a", a.mod_revision), Compare("/b", b.mod_revision), Compare("/c", 0)],
        [Put("/a", b"x"), Put("/b", b"x"), Put("/c", b"x")],
    )
    assert not result.succeeded and result.revision == bumped.revision
    assert store.get("/a").value == b"1" and store.get("/b").value == b"2"
    assert store.get("/c") is None


def test_range_prefix_sorted_keys_only_and_limit(store):
    store.txn(
        [],
        [Put(f"/p/{k}", k.encode()) for k in ("c", "a", "b")]
        + [Put("/q/a", b"x"), Put("/p", b"not under /p/")],
    )
    kvs = store.range("/p/")
    assert [(kv.key, kv.value) for kv in kvs] == [("/p/a", b"a"), ("/p/b", b"b"), ("/p/c", b"c")]
    keys = store.range("/p/", keys_only=True)
    assert [kv.key for kv in keys] == ["/p/a", "/p/b", "/p/c"]
    assert all(kv.value == b"" and kv.mod_revision for kv in keys)
    assert [kv.key for kv in store.range("/p/", limit=2)] == ["/p/a", "/p/b"]
    assert {kv.key for kv in store.range("")} == {"/p/a", "/p/b", "/p/c", "/q/a", "/p"}


def test_delete_key_and_prefix(store):
    store.txn([], [Put("/d/1", b""), Put("/d/2", b""), Put("/d", b""), Put("/e", b"")])
    store.txn([], [Delete("/d/", prefix=True)])
    assert [kv.key for kv in store.range("/")] == ["/d", "/e"]
    result = store.txn([Compare("/e", store.get("/e").mod_revision)], [Delete("/e")])
    assert result.succeeded and store.get("/e") is None
    assert store.txn([], [Delete("/nothing")]).succeeded  # deleting nothing is fine


def test_revision_follows_writes(store):
    before = store.revision()
    result = store.txn([], [Put("/r", b"1")])
    assert result.revision == before + 1 == store.revision()


def test_binary_values_round_trip(store):
    value = bytes(range(256)) * 4
    store.txn([], [Put("/bin", value)])
    assert store.get("/bin").value == value


def test_concurrent_cas_increments_lose_nothing(store):
    """8 threads x 25 read-CAS-retry increments of one key: exactly 200 commits."""
    store.txn([Compare("/counter", 0)], [Put("/counter", b"0")])

    def worker() -> None:
        for _ in range(25):
            while True:
                kv = store.get("/counter")
                result = store.txn(
                    [Compare(kv.key, kv.mod_revision)],
                    [Put(kv.key, str(int(kv.value) + 1).encode())],
                )
                if result.succeeded:
                    break

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.get("/counter").value == b"200"


def test_duplicate_key_in_txn_is_an_error_not_a_traceback(store):
    with pytest.raises(InternalError) as err:
        store.txn([], [Put("/dup", b"1"), Put("/dup", b"2")])
    assert "duplicate key" in err.value.details


@pytest.mark.parametrize(
    "endpoints, kw, fragment",
    [
        ([], {}, "at least one endpoint"),
        (["127.0.0.1:2379"], {}, "not http(s)://host:port"),
        (["http://a:1", "https://b:2"], {"ca": "/x"}, "mixes http"),
        (["http://a:1"], {"ca": "/x"}, "use https://"),
        (["https://a:1"], {"cert": "/c"}, "both 'cert' and 'key'"),
        (["https://a:1"], {"ca": "/does/not/exist"}, "cannot read /does/not/exist"),
        (["http://a:1"], {"options": {"requestTimeout": "2s"}}, "store.requestTimeout"),
    ],
)
def test_bad_config_is_invalid_config(endpoints, kw, fragment):
    with pytest.raises(InvalidConfig) as err:
        EtcdStore(endpoints, **kw)
    assert fragment in str(err.value)


def test_from_config_passes_options(etcd_shared):
    from pycnid.config import parse_daemon_config
    from store import open_store

    config = parse_daemon_config(
        {
            "store": {
                "type": "etcd",
                "endpoints": etcd_shared.endpoints,
                "requestTimeout": 1.5,
                "statusTimeout": 0.5,
            }
        }
    )
    store = open_store(config.store)
    try:
        assert isinstance(store, EtcdStore)
        assert (store.options.request_timeout, store.options.status_timeout) == (1.5, 0.5)
        store.status()
        assert store.txn([], [Put("/cfg", b"1")]).succeeded
    finally:
        store.close()

"""How the pool watch's updates change a node's PoolCache (ipam/leases/pool_watch.py), on a real
SQLite store: puts, deletes, snapshots replacing the set, corrupt records, stale updates."""

from __future__ import annotations

from ipam.alloc.pool_cache import PoolCache
from ipam.leases.pool_watch import apply_delete, apply_put, apply_snapshot, supports_watch
from store.base import KV
from store.codec import encode
from store.keys import POOLS
from store.sqlite import SqliteStore


def record(name: str, cidr: str, disabled: bool = False) -> dict:
    return {
        "name": name,
        "cidr": cidr,
        "blockSize": 28,
        "disabled": disabled,
        "nodeSelector": {},
        "strictAffinity": False,
        "exclusions": [],
        "gateway": "none",
        "reuseDelay": 120,
        "createdAt": 0,
    }


def kv(name: str, revision: int, **fields) -> KV:
    return KV(POOLS + name, encode(record(name, **fields)), revision)


def make_cache(tmp_path) -> PoolCache:
    return PoolCache(SqliteStore(str(tmp_path / "store.db")), "node1")


def test_put_disable_and_delete_reach_a_loaded_pool(tmp_path):
    cache = make_cache(tmp_path)
    apply_put(cache, kv("p", 5, cidr="10.1.0.0/24"))
    state = cache.cluster_state("p")
    assert not state.pool.disabled and state.record_rev == 5
    apply_put(cache, kv("p", 7, cidr="10.1.0.0/24", disabled=True))
    assert cache.states["p"].pool.disabled and cache.records["p"][0] == 7
    apply_delete(cache, "p", 9)
    assert "p" not in cache.records and "p" not in cache.states


def test_a_stale_update_never_overrides_a_newer_read(tmp_path):
    cache = make_cache(tmp_path)
    apply_put(cache, kv("p", 8, cidr="10.1.0.0/24", disabled=True))
    apply_put(cache, kv("p", 6, cidr="10.1.0.0/24"))
    apply_delete(cache, "p", 7)
    assert cache.records["p"][0] == 8 and cache.records["p"][1]["disabled"] is True


def test_a_snapshot_replaces_the_cached_set(tmp_path):
    cache = make_cache(tmp_path)
    apply_put(cache, kv("old", 3, cidr="10.1.0.0/24"))
    cache.cluster_state("old")
    apply_snapshot(cache, [kv("new", 10, cidr="10.2.0.0/24")], 12)
    assert set(cache.records) == {"new"} and "old" not in cache.states


def test_a_corrupt_record_is_set_aside_and_named(tmp_path):
    cache = make_cache(tmp_path)
    apply_put(cache, kv("p", 3, cidr="10.1.0.0/24"))
    apply_put(cache, KV(POOLS + "p", b"{not json", 4))
    assert "p" not in cache.records and "corrupt" in str(cache.bad_records["p"])
    apply_put(cache, kv("p", 5, cidr="10.1.0.0/24"))
    assert "p" in cache.records and "p" not in cache.bad_records


def test_sqlite_has_no_watch(tmp_path):
    assert not supports_watch(SqliteStore(str(tmp_path / "store.db")))

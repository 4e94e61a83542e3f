"""Keep this node's cached pool records current by watching ``/pycni/v1/pools/`` in etcd.

Without it the node learns of an operator's ``pycni ipam pool set --disabled`` / ``pool rm`` /
``pool add`` only when a txn loses its compare on the pool record, or when the planner re-reads
the pools before a refusal (``Planner.plan_acquire``). With it: the prefix is read once at
revision R, then watched from R + 1 (``EtcdStore.watch``: resumed from the last revision seen
after any stream error, a snapshot of the whole prefix when that revision was compacted). Each
change goes into the ``PoolCache`` (``note_pool``); a snapshot replaces the cached set. The
cache is touched only as a job of the lease service's combiner (``leases.run``), so never while
a request plans with it; a job plans no write, so it costs no txn.

Metrics on pycnid's registry: ``pycni_ipam_pool_watch_events_total{kind=put|delete|snapshot}``
and the gauge ``pycni_ipam_pool_watch_revision`` (the last revision seen). One info line per
snapshot and per resumed stream (logged with the first update after it).

SQLite has no watch and needs none: its single pycnid is the only writer besides the CLI on
that node, and the CLI's commit moves SQLite's ``data_version``, which the pool cache checks
before every plan (``PoolCache.sync``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeGuard

from cni.spec.errors import CNIError
from common.loop import Backoff, Errors, Loop
from ipam.alloc.allocator import pool_from_record
from ipam.alloc.pool_cache import PoolCache
from ipam.leases.metrics import DaemonHooks
from ipam.leases.service import LeaseService
from store.base import KV, Store
from store.codec import decode
from store.keys import POOLS

if TYPE_CHECKING:
    from common.metrics import Registry
    from store.etcd_watch import Watch, WatchEvent, WatchingStore, WatchUpdate

log = logging.getLogger("pycnid.ipam")
RETRY_MIN, RETRY_MAX = 0.2, 2.0


def supports_watch(store: Store) -> TypeGuard[WatchingStore]:
    return callable(getattr(store, "watch", None)) and callable(getattr(store, "range_at", None))


def is_older(cache: PoolCache, name: str, revision: int) -> bool:
    """The cache already holds a newer version of the pool's record (a re-read after a lost
    compare can run ahead of the watch)."""
    cached = cache.records.get(name, (0, None))[0]
    state = cache.states.get(name)
    if state is not None:
        cached = max(cached, state.record_rev)
    return cached > revision


def apply_put(cache: PoolCache, kv: KV) -> None:
    name = kv.key[len(POOLS) :]
    if is_older(cache, name, kv.mod_revision):
        return
    try:
        record = decode(kv.key, kv.value)
        if record.get("source") != "netconf":
            pool_from_record(record)
    except CNIError as err:
        log.warning("ignoring IPAM pool %s: %s", name, err)
        cache.bad_records[name] = err
        if name in cache.records:
            cache.note_pool(name, 0, None)
        return
    cache.bad_records.pop(name, None)
    cache.note_pool(name, kv.mod_revision, record)


def apply_delete(cache: PoolCache, name: str, revision: int) -> None:
    if is_older(cache, name, revision):
        return
    cache.bad_records.pop(name, None)
    cache.note_pool(name, 0, None)  # absent: a txn compares revision 0


def apply_snapshot(cache: PoolCache, kvs: Sequence[KV], revision: int) -> None:
    """Every pool record as of ``revision``: those listed are noted, the others dropped."""
    present = {kv.key[len(POOLS) :] for kv in kvs}
    cached = (
        set(cache.records)
        | set(cache.bad_records)
        | {name for name, state in cache.states.items() if state.record is not None}
    )
    for name in cached - present:
        apply_delete(cache, name, revision)
    for kv in kvs:
        apply_put(cache, kv)


class PoolWatch:
    """``start()`` returns at once: the first read (retried while the store is away) and the
    watch run on a thread of their own; ``stop()`` ends both."""

    def __init__(self, store: WatchingStore, leases: LeaseService, registry: Registry) -> None:
        self.store, self.leases = store, leases
        self.events = registry.counter(
            "pycni_ipam_pool_watch_events_total",
            "pool record changes this node applied from its watch",
        )
        self.revision = registry.gauge(
            "pycni_ipam_pool_watch_revision", "the last store revision the pool watch has seen"
        )
        self.watch: Watch | None = None
        self._restarts = 0
        self.loop = Loop(
            "ipam-pool-watch",
            self.begin,
            retry=Backoff(RETRY_MIN, RETRY_MAX).next,
            errors=Errors(log, f"pool watch: cannot read {POOLS} yet"),
            registry=registry,
        )

    def start(self) -> PoolWatch:
        self.loop.start()
        return self

    def stop(self) -> None:
        self.loop.stop()
        if self.watch is not None:
            self.watch.cancel()

    def begin(self) -> None:
        """The loop's one step (retried while the store is away): read, then watch."""
        kvs, revision = self.store.range_at(POOLS)
        log.info(
            "pool watch: %d pool record(s) at revision %d; watching from %d",
            len(kvs),
            revision,
            revision + 1,
        )
        self._in_cache(lambda cache: apply_snapshot(cache, kvs, revision), revision)
        self.revision.set(revision)
        if not self.loop.stopping:
            self.watch = self.store.watch(POOLS, revision + 1, self.on_update)

    def on_update(self, update: WatchUpdate) -> None:
        """The watch's callback (its thread, one update at a time, in revision order)."""
        restarts = self.watch.restarts if self.watch is not None else 0
        if restarts != self._restarts:
            self._restarts = restarts
            log.info(
                "pool watch resumed at revision %d (stream restarted %d time(s))",
                update.revision,
                restarts,
            )
        if update.snapshot:
            log.info(
                "pool watch: snapshot of %d pool record(s) at revision %d",
                len(update.events),
                update.revision,
            )
            kvs = [e.kv for e in update.events]
            self._in_cache(
                lambda cache: apply_snapshot(cache, kvs, update.revision), update.revision
            )
            self.events.inc(kind="snapshot")
        else:
            self._in_cache(lambda cache: self._apply_events(cache, update.events), update.revision)
            for event in update.events:
                self.events.inc(kind=event.kind)
        self.revision.set(update.revision)

    @staticmethod
    def _apply_events(cache: PoolCache, events: Sequence[WatchEvent]) -> None:
        for event in events:
            if event.kind == "delete":
                apply_delete(cache, event.kv.key[len(POOLS) :], event.kv.mod_revision)
            else:
                apply_put(cache, event.kv)

    def _in_cache(self, change: Callable[[PoolCache], None], revision: int) -> None:
        """Run ``change`` on the cache as a combiner job (it plans no write: no txn of its
        own). Should the batch it joined fail, the change was made when it was planned."""
        try:
            self.leases.run(
                lambda _plan: change(self.leases.cache),
                f"pool watch update at revision {revision}",
            )
        except CNIError as err:
            log.debug("pool watch: the batch of revision %d failed: %s", revision, err)


def start_pool_watch(life: DaemonHooks, store: Store, leases: LeaseService) -> PoolWatch | None:
    """Watch the pool records when the store can (etcd); None for SQLite."""
    if not supports_watch(store):
        return None
    watch = PoolWatch(store, leases, life.metrics).start()
    life.on_shutdown.append(watch.stop)
    return watch

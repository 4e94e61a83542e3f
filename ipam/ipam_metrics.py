"""pycni-ipam's Prometheus metrics, on pycnid's registry (``services.metrics``).

Counted as they happen (from the lease service's hooks):
``pycni_ipam_cas_conflicts_total`` (txns lost to a concurrent writer), ``pycni_ipam_cas_retries_total``
(further attempts), ``pycni_ipam_block_events_total{event=claim|borrow|return, pool}`` and the
``pycni_ipam_allocation_seconds`` histogram (one ADD's lease, queueing included).

Computed at scrape time from the store (pool records and blocks: two ranges, no handles, at
most once per ``ttl`` seconds, default 30, however many gauges and scrapes), counted by
``ipam.inspect`` exactly as ``pycni ipam show`` counts: ``pycni_ipam_pool_size{pool}``,
``pycni_ipam_addresses_in_use|free|cooling|borrowed{pool}``, ``pycni_ipam_blocks{pool, node}``.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ipam.daemon.metrics import Labels, labels
from ipam.inspect import BLOCKS, POOLS, BlockView, CorruptRecord, calc_pool_usage, load_json, \
    parse_pool
from ipam.store.base import Store

ADDRESS_STATES = {"in_use": "used", "free": "free", "cooling": "cooling",
                  "borrowed": "borrowed"}


class IpamMetrics:
    def __init__(self, registry: Any, store: Store, *, ttl: float = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.ttl, self.clock = store, ttl, clock
        self._lock = threading.Lock()
        self._at: float | None = None
        self._usage: dict[str, dict[str, int]] = {}
        self._blocks: dict[tuple[str, str], int] = {}
        self.conflicts = registry.counter("pycni_ipam_cas_conflicts_total",
                                          "IPAM txns lost to a concurrent writer and retried")
        self.retries = registry.counter("pycni_ipam_cas_retries_total",
                                        "further attempts of an IPAM txn after a lost compare")
        self.events = registry.counter("pycni_ipam_block_events_total",
                                       "blocks claimed, addresses borrowed, blocks returned")
        self.latency = registry.histogram("pycni_ipam_allocation_seconds",
                                          "time to lease the addresses of one ADD")
        registry.gauge("pycni_ipam_pool_size", "addresses of the pool that can be handed out",
                       lambda: self._per_pool("capacity"))
        for suffix, field in ADDRESS_STATES.items():
            registry.gauge(f"pycni_ipam_addresses_{suffix}", f"addresses of the pool: {suffix}",
                           lambda field=field: self._per_pool(field))
        registry.gauge("pycni_ipam_blocks", "blocks claimed per pool and node", self._per_node)

    def attach(self, leases: Any) -> None:
        """Feed the counters from a LeaseService's hooks."""
        leases.on_conflict = self.conflicts.inc
        leases.on_retry = self.retries.inc
        leases.on_event = lambda event, pool: self.events.inc(event=event, pool=pool)
        leases.on_latency = self.latency.observe

    def _per_pool(self, field: str) -> dict[Labels, float]:
        self.refresh()
        return {labels(pool=pool): float(usage[field]) for pool, usage in self._usage.items()}

    def _per_node(self) -> dict[Labels, float]:
        self.refresh()
        return {labels(pool=pool, node=node): float(n) for (pool, node), n in
                self._blocks.items()}

    def refresh(self) -> None:
        """Re-read pools and blocks when the last read is older than ``ttl``."""
        with self._lock:
            now = self.clock()
            if self._at is not None and now - self._at < self.ttl:
                return
            self._usage, self._blocks = read_usage(self.store, now)
            self._at = now


def read_usage(store: Store, now: float) -> tuple[dict[str, dict[str, int]],
                                                  dict[tuple[str, str], int]]:
    """Per pool {capacity, used, free, cooling, borrowed}, and blocks per (pool, node)."""
    pools = {view.name: view for view in map(parse_pool, store.range(POOLS)) if view.spec}
    by_pool: dict[str, list[BlockView]] = {name: [] for name in pools}
    per_node: dict[tuple[str, str], int] = {}
    for kv in store.range(BLOCKS):
        try:
            block = BlockView.from_record(kv.key, kv.mod_revision, load_json(kv.value))
        except CorruptRecord:
            continue
        by_pool.setdefault(block.pool, []).append(block)
        per_node[(block.pool, block.affinity)] = per_node.get((block.pool, block.affinity), 0) + 1
    usage = {name: {"capacity": u.capacity, **u.to_dict()} for name, u in
             ((name, calc_pool_usage(pools[name].spec, by_pool[name], {}, now))
              for name in pools)}
    return usage, per_node

"""pycni-ipam's Prometheus metrics, on pycnid's registry (``services.metrics``).

Counted as they happen (from the lease service's hooks):
``pycni_ipam_cas_conflicts_total`` (txns lost to a concurrent writer),
``pycni_ipam_cas_retries_total`` (further attempts),
``pycni_ipam_block_events_total{event=claim|borrow|return, pool}`` and the
``pycni_ipam_allocation_seconds`` histogram (one ADD's lease, queueing included).

Read from the store in the background (pool records and blocks: two ranges, no handles, every
``ipam.metricsInterval`` seconds, default 30, by a thread of their own) and counted by
``ipam.alloc.usage`` exactly as ``pycni ipam show`` counts: ``pycni_ipam_pool_size{pool}``,
``pycni_ipam_addresses_in_use|free|cooling|borrowed{pool}``, ``pycni_ipam_blocks{pool, node}``.
A scrape never calls the store: it renders the last good snapshot, whatever the store does (an
etcd outage makes a read wait its request timeout), with ``pycni_ipam_usage_age_seconds`` (how
old that snapshot is; since the start while there has been none) and
``pycni_ipam_usage_refresh_failed`` (1 when the last read failed, the figures are then stale).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cni.spec.errors import CNIError, InvalidConfig
from common.loop import Periodic
from common.metrics import Labels, labels
from ipam.alloc.pool_settings import PoolInvalid
from ipam.alloc.pool_spec import PoolSpec, spec_from_record
from ipam.alloc.usage import calc_pool_usage
from ipam.records import BLOCKS, POOLS, BlockRecord, CorruptRecord, decode
from store.base import KV, Store

ADDRESS_STATES = {"in_use": "used", "free": "free", "cooling": "cooling", "borrowed": "borrowed"}


log = logging.getLogger("pycnid.ipam")


@dataclass(frozen=True)
class UsageSnapshot:
    """What one good read of the store found, and when (``clock`` time)."""

    taken: float
    usage: dict[str, dict[str, int]] = field(default_factory=dict)
    blocks: dict[tuple[str, str], int] = field(default_factory=dict)


class IpamMetrics:
    def __init__(
        self, registry: Any, store: Store, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.store, self.clock = store, clock
        self.snapshot = UsageSnapshot(clock())  # empty until the first good read
        self.failed = False
        self.conflicts = registry.counter(
            "pycni_ipam_cas_conflicts_total", "IPAM txns lost to a concurrent writer and retried"
        )
        self.retries = registry.counter(
            "pycni_ipam_cas_retries_total", "further attempts of an IPAM txn after a lost compare"
        )
        self.events = registry.counter(
            "pycni_ipam_block_events_total", "blocks claimed, addresses borrowed, blocks returned"
        )
        self.latency = registry.histogram(
            "pycni_ipam_allocation_seconds", "time to lease the addresses of one ADD"
        )
        registry.gauge(
            "pycni_ipam_pool_size",
            "addresses of the pool that can be handed out",
            lambda: self._per_pool("capacity"),
        )
        for suffix, state in ADDRESS_STATES.items():
            registry.gauge(
                f"pycni_ipam_addresses_{suffix}",
                f"addresses of the pool: {suffix}",
                lambda state=state: self._per_pool(state),
            )
        registry.gauge("pycni_ipam_blocks", "blocks claimed per pool and node", self._per_node)
        registry.gauge(
            "pycni_ipam_usage_age_seconds",
            "age of the pool and block figures (seconds since the last good read)",
            lambda: {(): max(0.0, self.clock() - self.snapshot.taken)},
        )
        registry.gauge(
            "pycni_ipam_usage_refresh_failed",
            "1 when the last read of pools and blocks failed (figures are stale)",
            lambda: {(): float(self.failed)},
        )

    def attach(self, leases: Any) -> None:
        """Feed the counters from a LeaseService's hooks."""
        leases.on_conflict = self.conflicts.inc
        leases.on_retry = self.retries.inc
        leases.on_event = lambda event, pool: self.events.inc(event=event, pool=pool)
        leases.on_latency = self.latency.observe

    def _per_pool(self, name: str) -> dict[Labels, float]:
        usage = self.snapshot.usage
        return {labels(pool=pool): float(figures[name]) for pool, figures in usage.items()}

    def _per_node(self) -> dict[Labels, float]:
        blocks = self.snapshot.blocks
        return {labels(pool=pool, node=node): float(n) for (pool, node), n in blocks.items()}

    def refresh(self) -> None:
        """Read pools and blocks into a new snapshot; on failure keep the old one, flagged."""
        now = self.clock()
        try:
            usage, blocks = read_usage(self.store, now)
        except CNIError as err:  # unreachable or timed out: expected in an outage
            self.note_failure(f"{err.msg}: {err.details}" if err.details else err.msg)
            return
        except Exception:  # noqa: BLE001 - a bug: logged with its stack, figures kept
            log.exception("IPAM metrics: reading pools and blocks failed")
            self.failed = True
            return
        if self.failed:
            log.info("IPAM metrics: pools and blocks read again")
        self.snapshot, self.failed = UsageSnapshot(now, usage, blocks), False

    def note_failure(self, why: str) -> None:
        """Warn once per failing stretch; the gauges say the rest."""
        if not self.failed:
            log.warning(
                "IPAM metrics: pools and blocks not read, serving the last figures: %s", why
            )
        self.failed = True


def start_ipam_metrics(
    services: Any, store: Store, leases: Any, interval: float, *, serve: bool
) -> IpamMetrics:
    """The IPAM metrics on pycnid's registry; with ``serve`` (a metrics endpoint is configured)
    a background thread refreshes the store-backed figures every ``interval`` seconds,
    stopped through ``services.on_shutdown``."""
    if interval <= 0:
        raise InvalidConfig(
            "invalid daemon config key 'ipam.metricsInterval'",
            f"expected a number of seconds > 0, got {interval!r}",
        )
    metrics = IpamMetrics(services.metrics, store)
    metrics.attach(leases)
    if serve:
        refresher = Periodic(
            "ipam-metrics", interval, metrics.refresh, registry=services.metrics
        ).start()
        services.on_shutdown.append(refresher.stop)
    return metrics


def read_usage(
    store: Store, now: float
) -> tuple[dict[str, dict[str, int]], dict[tuple[str, str], int]]:
    """Per pool {capacity, used, free, cooling, borrowed}, and blocks per (pool, node)."""
    pools = {name: spec for name, spec in map(read_spec, store.range(POOLS)) if spec}
    by_pool: dict[str, list[BlockRecord]] = {name: [] for name in pools}
    per_node: dict[tuple[str, str], int] = {}
    for kv in store.range(BLOCKS):
        try:
            block = BlockRecord.at_key(kv.key, kv.value)
        except CorruptRecord:
            continue
        by_pool.setdefault(block.pool, []).append(block)
        per_node[(block.pool, block.affinity)] = per_node.get((block.pool, block.affinity), 0) + 1
    usage = {
        name: {"capacity": u.capacity, **u.to_dict()}
        for name, u in (
            (name, calc_pool_usage(pools[name], by_pool[name], {}, now)) for name in pools
        )
    }
    return usage, per_node


def read_spec(kv: KV) -> tuple[str, PoolSpec | None]:
    """A pool record's spec (None: unusable); a corrupt record fails the read."""
    name = kv.key[len(POOLS) :]
    try:
        return name, spec_from_record({**decode(kv.key, kv.value), "name": name})
    except PoolInvalid:
        return name, None

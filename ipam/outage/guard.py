"""Outage tolerance: pycni-ipam keeps serving ADDs for a while when etcd is unreachable.

Each node keeps ``ipam.bufferSize`` addresses per pool (default 8) reserved in etcd under its
buffer handle ``_buffer/<node>/<pool>`` (``ipam/outage/txns.py``) and a copy in memory and in
``<stateDir>/ipam-outage/`` (``ipam/outage/files.py``). The guard wraps the ADD/DEL path:

- ADD with the store reachable and nothing to write back: the normal lease (one CAS txn), each
  of its store calls bounded by ``ipam.addBudget`` seconds (default 2).
- ADD when the store does not answer (or is known down: then without asking it at all, also
  for requests already queued in the lease service): an address per range set is taken
  from the in-memory buffer, journalled (append + fsync) and returned. Buffer empty, no buffer,
  or a static IP request: code 11 at once. Repeating the ADD returns the same addresses.
- DEL when the store does not answer: journalled, answered as done.
- The reconciler (``ipam/outage/writeback.py``, on the guard's loop) probes the store (at once
  after a failed call, then every 0.5 s while it stays down; only a failed probe marks it
  down); once it answers, the journal is replayed in order (one txn per entry), the snapshot
  rewritten, then the journal shortened, and the buffers refilled. An ADD/DEL arriving while
  entries wait replays them first, so the store path never overtakes the journal.

STATUS still answers 50 while the store is down (``IpamPlugin.status``). SQLite stores never
become unreachable and get no guard (``NoGuard``). Known limit: after a restart in the middle
of an outage, repeating an ADD made *before* the outage gets a second address (the handle then
holds both once written back: nothing is freed that a container may use).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from cni.spec.errors import CNIError, TryAgainLater
from common.loop import Errors, Loop
from ipam.alloc.selection import Selection
from ipam.leases.service import LeaseService
from ipam.outage.calc import Names, calc_pool_names, handle_dict
from ipam.outage.files import OutageFiles
from ipam.outage.store import StoreUnreachable, TrackedStore
from ipam.outage.writeback import REFILL_PAUSE, WriteBack
from ipam.records import HandleId, HandleRecord, LeasedIP
from store.deadline import call_budget

if TYPE_CHECKING:
    from common.metrics import Registry

log = logging.getLogger("pycnid.outage")
Commit = Callable[[], tuple[HandleRecord, bool]]
CATCH_UP_WAIT = 0.2  # an ADD waits this long for a running replay before using the buffer


class OutageGuard(WriteBack):
    """Around a ``LeaseService`` whose store is a ``TrackedStore``; the write-back half (load,
    sync, replay, refill) is ``WriteBack``."""

    def __init__(
        self,
        leases: LeaseService,
        files: OutageFiles,
        *,
        size: int,
        budget: float,
        clock: Callable[[], float] = time.time,
        metrics: Registry | None = None,
    ) -> None:
        store = leases.store
        if not isinstance(store, TrackedStore):
            raise TypeError(f"the outage guard needs its store tracked, not {store.name}")
        self.leases, self.store, self.node = leases, store, leases.node
        self.reach, self.files = store.reach, files
        self.size, self.budget, self.clock = size, budget, clock
        self._lock = threading.Lock()  # in-memory state and the journal file
        self._sync = threading.Lock()  # one replay / refill at a time
        self.entries: list[dict] = []
        self.pending: dict[str, HandleRecord] = {}  # served from the buffer, not written back
        self.known: dict[str, HandleRecord] = {}  # leases this daemon committed
        self.buffers: dict[str, list[LeasedIP]] = {}  # what may still be handed out
        self.stored: dict[str, list[dict]] = {}  # the snapshot as last saved
        self.pools: set[str] = set()  # pools to keep a buffer for
        self.selections: dict[Selection, Names] = {}  # the pools each selection was served from
        self._next_wake: dict[str, float] = {}  # ADDs wake the reconciler at most this often
        self._next_refill: dict[str, float] = {}  # a pool that stayed short waits until then
        self._seq = 0
        self._wake = threading.Event()
        self.reach.on_suspect = self._wake.set  # a failed call: probe the store now
        registry = self._counters(metrics)
        self.loop = Loop(
            "ipam-outage",
            self.reconcile,
            retry=self.calc_pause,
            wake=self._wake,
            errors=Errors(log, "outage sync", logging.DEBUG),
            registry=registry,
            join_timeout=10,
        )

    def _counters(self, metrics: Registry | None) -> Registry:
        if metrics is None:
            from common.metrics import Registry

            metrics = Registry()
        self.served = metrics.counter(
            "pycni_ipam_outage_served_total", "ADDs answered from the outage buffer"
        )
        self.replayed = metrics.counter(
            "pycni_ipam_outage_replayed_total", "Journal entries written back to the store"
        )
        self.conflicts = metrics.counter(
            "pycni_ipam_outage_conflicts_total",
            "Buffer addresses found held by others at write-back",
        )
        metrics.gauge(
            "pycni_ipam_outage_buffer_addresses",
            "Addresses this node may hand out during a store outage, by pool",
            lambda: {(("pool", p),): len(ips) for p, ips in self.buffers.items()},
        )
        metrics.gauge(
            "pycni_ipam_outage_journal_entries",
            "Journal entries not written back",
            lambda: {(): len(self.entries)},
        )
        metrics.gauge(
            "pycni_ipam_store_reachable",
            "1 when the IPAM store answered last",
            lambda: {(): 0 if self.reach.down else 1},
        )
        return metrics

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> OutageGuard:
        self.loop.start()
        return self

    def stop(self) -> None:
        self.loop.stop()

    # -- the ADD / DEL path -------------------------------------------------------------------
    def acquire(
        self,
        handle: HandleId,
        selection: Selection,
        attributes: Mapping[str, str],
        commit: Commit,
        static: bool = False,
    ) -> tuple[HandleRecord, bool]:
        served = self.pending.get(handle.key)
        if served is not None:
            return served, False
        if self.ready():
            try:
                with call_budget(self.budget):
                    record, created = commit()
            except StoreUnreachable as exc:
                return self.serve(handle, selection, attributes, static, exc)
            self.note_committed(record, selection, static)
            return record, created
        return self.serve(handle, selection, attributes, static, None)

    def release(self, handle: HandleId, commit: Callable[[], object]) -> None:
        if self.ready():
            try:
                with call_budget(self.budget):
                    commit()
                self.known.pop(handle.key, None)
                return
            except StoreUnreachable:
                pass
        with self._lock:
            self._journal({"op": "del", "handle": handle_dict(handle)})
            self.pending.pop(handle.key, None)
            self.known.pop(handle.key, None)
        log.warning("DEL of %s journalled: the store %s is unreachable", handle, self.store.name)

    def lookup(self, handle: HandleId) -> HandleRecord | None:
        """The record served from the buffer and not yet written back, if any."""
        return self.pending.get(handle.key)

    def forget(self, handles: list[HandleId]) -> None:
        for handle in handles:
            self.known.pop(handle.key, None)

    def ready(self) -> bool:
        """May the store path be used now? (store not known down, nothing left to replay)"""
        if self.reach.down:
            return False
        return not self.entries or self.catch_up(CATCH_UP_WAIT)

    def catch_up(self, wait: float) -> bool:
        if not self._sync.acquire(timeout=wait):
            return False
        try:
            with call_budget(self.budget):
                self.replay()
        except CNIError as exc:
            log.info("write-back not finished: %s", exc)
        finally:
            self._sync.release()
        return not self.entries

    def serve(
        self,
        handle: HandleId,
        selection: Selection,
        attributes: Mapping[str, str],
        static: bool,
        cause: CNIError | None,
    ) -> tuple[HandleRecord, bool]:
        with self._lock:
            known = self.known.get(handle.key)
            if known is not None:
                return known, False
            names = self.selections.get(selection) or calc_pool_names(selection, self.buffers)
            picks = self._pick(names, static, cause)
            record = HandleRecord(
                handle, tuple(picks), {**attributes, "node": self.node}, self.clock()
            )
            self._journal(
                {
                    "op": "add",
                    "handle": handle_dict(handle),
                    "record": json.loads(record.to_bytes()),
                }
            )
            for ip in picks:
                self.buffers[ip.pool].remove(ip)
            self.pending[handle.key] = record
        self.served.inc()
        log.warning(
            "ADD of %s served from the outage buffer: %s",
            handle,
            ", ".join(ip.address for ip in picks),
        )
        return record, True

    def _pick(self, names: Names, static: bool, cause: CNIError | None) -> list[LeasedIP]:
        why = str(cause) if cause else self.reach.reason or "no answer"
        if static:
            raise TryAgainLater(
                f"the store {self.store.name} is unreachable; a requested "
                "address cannot be checked until it is back",
                why,
            )
        picks = []
        for pools in names:
            ip = next((ips[0] for p in pools if (ips := self.buffers.get(p))), None)
            if ip is None:
                raise TryAgainLater(
                    f"the store {self.store.name} is unreachable and node "
                    f"{self.node} has no outage buffer address left in pool "
                    f"{', '.join(pools) or '(none known)'}",
                    f"retry when the store is back ({why})",
                )
            picks.append(ip)
        return picks

    def _journal(self, entry: dict) -> None:
        self._seq += 1
        entry = {**entry, "seq": self._seq, "at": self.clock()}
        self.files.append(entry)
        self.entries.append(entry)

    def note_committed(self, record: HandleRecord, selection: Selection, static: bool) -> None:
        """Remember the lease (a repeated ADD during an outage returns it) and, for a dynamic
        lease, which pools served it: those get a buffer, and serve it in an outage."""
        self.known[record.handle.key] = record
        if static or not self.size:
            return
        self.selections[selection] = tuple((ip.pool,) for ip in record.ips)
        now = time.monotonic()
        for pool in (ip.pool for ip in record.ips):
            self.pools.add(pool)
            if len(self.buffers.get(pool, ())) < self.size and now >= self._next_wake.get(
                pool, 0.0
            ):
                self._next_wake[pool] = now + REFILL_PAUSE
                self._wake.set()


class NoGuard:
    """The ADD/DEL path without outage handling (SQLite: the store is local)."""

    def acquire(
        self,
        handle: HandleId,
        selection: Selection,
        attributes: Mapping[str, str],
        commit: Commit,
        static: bool = False,
    ) -> tuple[HandleRecord, bool]:
        return commit()

    def release(self, handle: HandleId, commit: Callable[[], object]) -> None:
        commit()

    def lookup(self, handle: HandleId) -> HandleRecord | None:
        return None

    def forget(self, handles: list[HandleId]) -> None:
        pass

    def stop(self) -> None:
        pass

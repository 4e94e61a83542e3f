"""The outage guard's write-back half: the journal and snapshot read after a restart, and the
reconciler that writes the journal back and keeps the buffers full once the store answers.

``WriteBack`` is the part of ``OutageGuard`` (``ipam/outage/guard.py``, the ADD/DEL path) that
runs on the guard's loop (``common/loop.py``, thread ``ipam-outage``): a step probes the store
(at once after a failed call, then every 0.5 s while it stays down or entries wait, else every
5 s); once it answers, the journal is replayed in order (one txn per entry), the snapshot
rewritten, then the journal shortened, and the buffers refilled. A failing probe or write-back
is one debug line; the next step tries again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Self

from ipam.leases.service import LeaseService
from ipam.outage.calc import calc_cancelled, entry_handle, entry_record, leased_ip
from ipam.outage.files import OutageFiles
from ipam.outage.txns import plan_refill, plan_replay, read_buffers
from ipam.records import HandleRecord, LeasedIP

log = logging.getLogger("pycnid.outage")
FAST, SLOW = 0.5, 5.0  # reconciler period while something waits / when all is quiet
REFILL_PAUSE = 2.0  # seconds between two refill attempts of a pool that stayed short


class WriteBack:
    """The state it shares with the request path is set up by ``OutageGuard.__init__``."""

    leases: LeaseService
    store: Any
    node: str
    reach: Any
    files: OutageFiles
    size: int
    clock: Callable[[], float]
    _lock: threading.Lock
    _sync: threading.Lock
    entries: list[dict]
    pending: dict[str, HandleRecord]
    known: dict[str, HandleRecord]
    buffers: dict[str, list[LeasedIP]]
    stored: dict[str, list[dict]]
    pools: set[str]
    _next_refill: dict[str, float]
    _seq: int
    replayed: Any
    conflicts: Any

    def load(self) -> Self:
        """Read the journal and the snapshot (after a restart: what was served, what is left)."""
        with self._lock:
            self.entries = self.files.entries()
            self._seq = max((int(e.get("seq", 0)) for e in self.entries), default=0)
            self.stored = self.files.load_buffers()
            self._rebuild(self.stored)
            self.pools |= set(self.stored)
        if self.entries:
            log.warning("outage journal holds %d entr(ies) to write back", len(self.entries))
        return self

    def _rebuild(self, snapshot: dict[str, list[dict]]) -> None:
        """pending and buffers from the journal and a snapshot (caller holds _lock)."""
        pending: dict[str, HandleRecord] = {}
        served: set[str] = set()
        for entry in self.entries:
            key = entry_handle(entry).key
            if entry["op"] == "add":
                record = pending[key] = entry_record(entry)
                served |= {ip.ip for ip in record.ips}
            else:
                pending.pop(key, None)
        self.pending = pending
        self.buffers = (
            {}
            if self.files.corrupt
            else {
                pool: [ip for ip in map(leased_ip, ips) if ip.ip not in served]
                for pool, ips in snapshot.items()
            }
        )

    def reconcile(self) -> float:
        """The loop's step: one sync, then the pause until the next (a failed one too)."""
        self.sync()
        return self.calc_pause()

    def calc_pause(self) -> float:
        return FAST if self.reach.suspect or self.entries else SLOW

    def sync(self) -> None:
        """Probe the store; when it answers, write the journal back and refill the buffers."""
        self.store.status()
        with self._sync:
            self.replay()
            if not self.entries:
                self.refresh_buffers()

    def replay(self) -> None:
        """Write journal entries back in order (caller holds _sync); stops at the first error."""
        with self._lock:
            batch = list(self.entries)
        if not batch:
            return
        cancelled, done = calc_cancelled(batch), set()
        try:
            for entry in batch:
                self._apply(entry, entry["seq"] in cancelled)
                done.add(entry["seq"])
        finally:
            if done:
                self._finish_replay(done)

    def _apply(self, entry: dict, cancelled: bool) -> None:
        handle = entry_handle(entry)
        if entry["op"] == "del":
            self.leases.release(handle)
            self.known.pop(handle.key, None)
        else:
            record, now = entry_record(entry), self.clock()
            conflicts = self.leases.run(
                lambda plan: plan_replay(self.leases.planner, plan, record, cancelled, now),
                f"write-back of {handle}",
            )
            for conflict in conflicts:
                self.conflicts.inc()
                log.error("outage write-back conflict: %s", conflict)
            if not cancelled:
                self.known[handle.key] = record
        self.replayed.inc()

    def _finish_replay(self, done: set[int]) -> None:
        """Snapshot first, then the shorter journal: a crash in between replays again."""
        stored = read_buffers(self.store, self.node)
        with self._lock:
            self.entries = [e for e in self.entries if e["seq"] not in done]
            self._save({pool: [ip.to_dict() for ip in r.ips] for pool, r in stored.items()})
            self.files.rewrite(self.entries)
            self.files.corrupt = False
            self._rebuild(self.stored)
        log.info("wrote back %d outage journal entr(ies); %d left", len(done), len(self.entries))

    def refresh_buffers(self) -> None:
        """Re-read the buffer handles, refill the short ones, save the snapshot if it moved."""
        stored = read_buffers(self.store, self.node)
        now = time.monotonic()
        for name in sorted(self.pools):
            have = len(stored[name].ips) if name in stored else 0
            if have >= self.size or now < self._next_refill.get(name, 0.0):
                continue
            record = self.leases.run(
                partial(
                    plan_refill, self.leases.planner, pool=name, size=self.size, clock=self.clock
                ),
                f"refill of the outage buffer of {name}",
            )
            if record is not None:
                stored[name] = record
            if (len(record.ips) if record else 0) < self.size:
                self._next_refill[name] = now + REFILL_PAUSE
        with self._lock:
            snapshot = {pool: [ip.to_dict() for ip in r.ips] for pool, r in stored.items()}
            if snapshot != self.stored:
                self._save(snapshot)
            self._rebuild(snapshot)

    def _save(self, snapshot: dict[str, list[dict]]) -> None:
        self.files.save_buffers(snapshot)
        self.stored = snapshot

"""The lease service: the allocation policy carried out over a ``Store``, one txn per ADD.

One ADD is one txn: it writes every block allocation, the handle and its attributes together
and compares the ``mod_revision`` of every key it touches (handle absent, each block as read
or absent for a claim, its affinity index entry, each pool record), so a dual-stack lease is
all-or-nothing and no address is ever in two handles, on any number of nodes. The node's own
blocks live in memory (``PoolCache``), so the common ADD and DEL need no read before the txn.
A lost compare re-reads the compared keys and plans again, with bounded jittered backoff
(``store/cas.py``, in the combiner).
Local requests are combined (``Combiner``): concurrent ADDs/DELs of one node share a txn, so
conflicts only come from other writers (other nodes, the CLI).

GC releases the handles *of this node* (attribute ``node``) in one network that are not in the
runtime's valid attachments; ``valid=None`` (no valid-attachments key, as cnitool sends) means
nothing is valid. Handles of other nodes are never touched. Empty blocks go back to the pool
after ``block_grace`` seconds (``return_empty_blocks``, run by the daemon's housekeeping).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, TypeVar, overload

from cni.spec.errors import AddressExhausted, CNIError, NotAvailable, TryAgainLater
from ipam.alloc.plan import Plan
from ipam.alloc.plan_view import PlanView
from ipam.alloc.planner import Planner, exhausted
from ipam.alloc.policy import choose_address
from ipam.alloc.pool_cache import PoolCache
from ipam.alloc.selection import RangeSets, RequestedIP, Selection, as_selection
from ipam.leases.combiner import Combiner
from ipam.records import DEFAULT_BLOCK_GRACE, HandleId, HandleRecord
from store.base import Store, change_counter
from store.keys import HANDLES, handles_prefix

log = logging.getLogger("pycnid.ipam")
T = TypeVar("T")
MAX_ATTEMPTS = 16
IN_DOUBT_WINDOW = 60.0  # seconds a txn that failed without an answer may still land


def is_valid(handle: HandleId, valid: Collection[tuple[str, str]] | None) -> bool:
    if valid is None:
        return False
    return (handle.container_id, handle.ifname) in valid or (handle.container_id, "") in valid


def _noop(*_: Any) -> None:
    return None


class LeaseService:
    """Hooks for metrics: ``on_conflict()`` per lost txn, ``on_retry()`` per further attempt,
    ``on_event(kind, pool)`` per committed claim/borrow/return, ``on_latency(seconds)`` per
    ADD."""

    def __init__(
        self,
        store: Store,
        node: str,
        *,
        labels: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        attempts: int = MAX_ATTEMPTS,
        on_conflict: Callable[[], None] | None = None,
        block_grace: float = DEFAULT_BLOCK_GRACE,
        max_batch: int = 16,
    ) -> None:
        self.store = store
        self.node = node
        self.clock = clock
        self.block_grace = block_grace
        self.on_conflict: Callable[[], None] = on_conflict or _noop
        self.on_retry: Callable[[], None] = _noop
        self.on_event: Callable[[str, str], None] = _noop
        self.on_latency: Callable[[float], None] = _noop
        self.cache = PoolCache(store, node, changes=change_counter(store))
        self.doubt = threading.Event()  # set when a txn's outcome became unknown
        self.planner = Planner(self.cache, node, labels or {}, clock)
        self.combiner = Combiner(
            self.commit,
            self.refresh,
            attempts,
            max_batch,
            store.name,
            lambda: self.on_retry(),
            lambda: self.on_conflict(),
        )

    @property
    def labels(self) -> dict[str, str]:
        return self.planner.labels

    def run(self, job: Callable[[Plan], T], what: str = "request") -> T:
        """Plan ``job`` (with the planner, under the node lock, combined with concurrent jobs)
        and commit it; retried from a fresh plan when a compare is lost."""
        return self.combiner.run(job, what)

    # -- reading ---------------------------------------------------------------------------
    def lookup(self, handle: HandleId) -> HandleRecord | None:
        kv = self.store.get(handle.key)
        return HandleRecord.from_bytes(kv.key, kv.value) if kv else None

    def handles(self, network: str) -> list[HandleRecord]:
        return [
            HandleRecord.from_bytes(kv.key, kv.value)
            for kv in self.store.range(handles_prefix(network))
        ]

    # -- ADD / DEL -------------------------------------------------------------------------
    def acquire(
        self,
        handle: HandleId,
        selection: Selection | RangeSets,
        requested: Mapping[int, RequestedIP] | Iterable[RequestedIP] | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> tuple[HandleRecord, bool]:
        """Lease one address per pool set to ``handle``; (record, newly created). Repeating
        it for a handle that exists returns the addresses it holds. ``requested``: static
        addresses (IPs or ``Requested``), each leased from the set it belongs to."""
        started = time.perf_counter()
        chosen = as_selection(handle.network, selection)
        wanted = list(requested.values() if isinstance(requested, Mapping) else requested or ())
        result = self.run(
            lambda plan: self.planner.plan_acquire(plan, handle, chosen, wanted, attributes or {}),
            f"lease for {handle}",
        )
        self.on_latency(time.perf_counter() - started)
        return result

    def release(self, handle: HandleId) -> HandleRecord | None:
        """Free every address ``handle`` holds and delete it; None when it holds nothing."""
        return self.run(
            lambda plan: self.planner.plan_release(plan, handle), f"release of {handle}"
        )

    # -- the txn ---------------------------------------------------------------------------
    def commit(self, plan: Plan) -> bool:
        """Run the plan's txn; on success teach the cache what it wrote. When the store fails
        without saying whether the txn landed, the handles it would have created are noted
        *in doubt*: the callers hear "try again later", and ``resolve_in_doubt`` releases
        them if they did land and no ADD has taken them since."""
        try:
            result = self.store.txn(plan.txn_compares(), plan.ops())
        except TryAgainLater:
            self.note_in_doubt(plan)
            raise
        if not result.succeeded:
            return False  # the combiner counts it (on_conflict) and plans again
        revision, cache = result.revision, self.cache
        for pool, cidr, block in plan.blocks.values():
            cache.note_block(pool, cidr, revision, block)
        for pool, cidr, present in plan.affinities.values():
            cache.note_affinity(pool, cidr, revision, present)
        for name, record in plan.pools.items():
            cache.note_pool(name, revision, record)
        for key, handle in plan.handles.items():
            cache.in_doubt.pop(key, None)
            if handle is None:
                cache.forget_handle(key)
            else:
                cache.note_handle(key, revision, handle)
        for kind, pool in plan.events:
            self.on_event(kind, pool)
        return True

    def note_in_doubt(self, plan: Plan) -> None:
        now = time.monotonic()
        for key, handle in plan.handles.items():
            if handle is not None:
                values, _ = self.cache.in_doubt.get(key, (set(), now))
                self.cache.in_doubt[key] = (values | {plan.puts[key]}, now)
        if plan.handles:
            self.doubt.set()

    def resolve_in_doubt(self) -> list[HandleId]:
        """Release the handles of failed ADDs whose txn landed after all (as written, not
        taken by a later ADD); forget those that did not land within ``IN_DOUBT_WINDOW``."""
        if not self.cache.in_doubt:
            return []
        released = self.run(self._plan_in_doubt, "rollback of in-doubt leases")
        if released:
            log.info(
                "rolled back %d lease(s) of failed ADDs that landed after all: %s",
                len(released),
                ", ".join(str(h) for h in released),
            )
        return released

    def _plan_in_doubt(self, plan: Plan) -> list[HandleId]:
        released = []
        for key, (values, since) in list(self.cache.in_doubt.items()):
            kv = self.store.get(key)
            if kv is not None and kv.value in values:
                record = HandleRecord.from_bytes(kv.key, kv.value)
                self.cache.note_handle(key, kv.mod_revision, record)
                self.planner.plan_release(plan, record.handle)
                released.append(record.handle)
            elif kv is not None or time.monotonic() - since > IN_DOUBT_WINDOW:
                del self.cache.in_doubt[key]  # taken or changed since, or it never landed
        return released

    def refresh(self, plan: Plan) -> None:
        """After a lost compare: re-read the keys the plan compared. Blocks, affinities and
        pools first; the handles (one per ADD of a combined txn) only when those did not
        change, since then a handle must be what the txn lost on (a repeated ADD)."""
        explained = False
        for key, compared in plan.compares.items():
            if not key.startswith(HANDLES):
                kv = self.store.get(key)
                explained |= (kv.mod_revision if kv else 0) != compared
                self.cache.refresh(key, kv, compared)
        if not explained:
            for key, compared in plan.compares.items():
                if key.startswith(HANDLES):
                    self.cache.refresh(key, self.store.get(key), compared)

    # -- GC, STATUS, housekeeping ----------------------------------------------------------
    def collect_garbage(
        self, network: str, valid: Collection[tuple[str, str]] | None
    ) -> list[HandleId]:
        """Release this node's handles in ``network`` that are not valid; keep going past
        errors and raise them together at the end."""
        released: list[HandleId] = []
        errors: list[CNIError] = []
        for kv in self.store.range(handles_prefix(network)):
            try:
                record = HandleRecord.from_bytes(kv.key, kv.value)
                if record.node == self.node and not is_valid(record.handle, valid):
                    if self.release(record.handle) is not None:
                        released.append(record.handle)
            except CNIError as err:
                errors.append(err)
        if errors:
            first = errors[0]
            raise type(first)(
                f"GC of network {network} failed for {len(errors)} handle(s)",
                "; ".join(str(e) for e in errors),
            )
        return released

    @overload
    def ensure_capacity(self, selection: Selection) -> None: ...

    @overload
    def ensure_capacity(self, selection: str, range_sets: RangeSets) -> None: ...

    def ensure_capacity(
        self, selection: Selection | str, range_sets: RangeSets | None = None
    ) -> None:
        """NotAvailable (50) unless every pool set still has an address for this node.
        Re-reads the pools, so it also resynchronises the cache. ``selection``: a Selection,
        or a network name with its range sets."""
        if not isinstance(selection, str):
            chosen = selection
        elif range_sets is None:
            raise TypeError(f"ensure_capacity of network {selection} without its range sets")
        else:
            chosen = as_selection(selection, range_sets)
        self.run(lambda plan: self._check_capacity(plan, chosen), "capacity check")

    def _check_capacity(self, plan: Plan, selection: Selection) -> None:
        try:
            sets = self.planner.pool_sets(selection, fresh=True)
        except AddressExhausted as err:
            raise NotAvailable(err.msg, err.details) from None
        for states in sets:
            view = PlanView(self.planner, plan, states)
            if choose_address([s.pool for s in states], view, self.node, self.clock()) is None:
                failure = exhausted(states, self.node)
                raise NotAvailable(failure.msg, failure.details)

    def return_empty_blocks(self) -> list[str]:
        """Give back this node's blocks empty for longer than the grace period."""
        returned = self.run(
            lambda plan: self.planner.plan_return_empty(plan, self.block_grace),
            "return of empty blocks",
        )
        if returned:
            log.info("returned empty blocks to their pools: %s", ", ".join(returned))
        return returned

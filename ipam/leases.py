"""The lease service: allocation policy (``allocator``) carried out over a ``Store``.

One ADD is one txn: it writes every block allocation and the handle together and compares
the ``mod_revision`` of every key it touches (handle absent, each block as read or absent for
a claim, each pool record), so a dual-stack lease is all-or-nothing and no address is ever in
two handles, on any number of nodes. A lost compare re-reads the compared keys and plans
again, with bounded jittered backoff; local requests are single-flighted by a lock (Calico's
host lock), so conflicts only come from other writers (other nodes, the CLI).

GC releases the handles *of this node* (attribute ``node``) in one network that are not in
the runtime's valid attachments; ``valid=None`` (no valid-attachments key, as cnitool sends)
means nothing is valid. Handles of other nodes are never touched.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterator, Mapping

from cni.spec.errors import (AddressConflict, AddressExhausted, CNIError, NotAvailable,
                             TryAgainLater)
from ipam.allocator import (Choice, IPAddr, Pool, Range, block_containing, calc_pools,
                            choose_address, find_pool, merge_pool_record)
from ipam.poolcache import PoolCache, PoolState, describe_blocks
from ipam.records import (BlockRecord, HandleId, HandleRecord, LeasedIP, block_key, encode,
                          handles_prefix, pool_key)
from ipam.store.base import Compare, Delete, Op, Put, Store

log = logging.getLogger("pycnid.ipam")
MAX_ATTEMPTS = 16
BACKOFF_CAP = 0.05

RangeSets = tuple[tuple[Range, ...], ...]


@dataclass
class Plan:
    """One txn being built: compares, ops, and what to remember once it commits."""

    compares: dict[str, int] = field(default_factory=dict)
    puts: dict[str, bytes] = field(default_factory=dict)
    deletes: list[str] = field(default_factory=list)
    blocks: dict[str, tuple[str, str, BlockRecord]] = field(default_factory=dict)
    pools: dict[str, dict] = field(default_factory=dict)

    def ops(self) -> list[Op]:
        return [*(Put(k, v) for k, v in self.puts.items()), *(Delete(k) for k in self.deletes)]

    def write_block(self, key: str, revision: int, pool: str, block: BlockRecord) -> None:
        self.compares.setdefault(key, revision)
        self.blocks[key] = (pool, block.cidr, block)
        self.puts[key] = block.to_bytes()


def backoff(attempt: int) -> None:
    time.sleep(random.uniform(0, min(BACKOFF_CAP, 0.001 * 2 ** attempt)))


def is_valid(handle: HandleId, valid: Collection[tuple[str, str]] | None) -> bool:
    if valid is None:
        return False
    return (handle.container_id, handle.ifname) in valid or (handle.container_id, "") in valid


class LeaseService:
    def __init__(self, store: Store, node: str, *, clock: Callable[[], float] = time.time,
                 attempts: int = MAX_ATTEMPTS,
                 on_conflict: Callable[[], None] | None = None) -> None:
        self.store = store
        self.node = node
        self.clock = clock
        self.attempts = attempts
        self.on_conflict = on_conflict or (lambda: None)
        self.cache = PoolCache(store, node)
        self._lock = threading.Lock()

    # -- reading ---------------------------------------------------------------------------
    def lookup(self, handle: HandleId) -> HandleRecord | None:
        kv = self.store.get(handle.key)
        return HandleRecord.from_bytes(kv.key, kv.value) if kv else None

    def handles(self, network: str) -> list[HandleRecord]:
        return [HandleRecord.from_bytes(kv.key, kv.value)
                for kv in self.store.range(handles_prefix(network))]

    # -- ADD -------------------------------------------------------------------------------
    def acquire(self, handle: HandleId, range_sets: RangeSets,
                requested: Mapping[int, IPAddr] | None = None,
                attributes: Mapping[str, str] | None = None) -> tuple[HandleRecord, bool]:
        """Lease one address per range set to ``handle``; (record, newly created).

        Repeating it for a handle that exists returns the addresses it holds.
        """
        requested = dict(requested or {})
        pool_sets = tuple(calc_pools(handle.network, rs) for rs in range_sets)
        attrs = {**(attributes or {}), "node": self.node}
        for _ in self._attempts(f"lease for {handle}"):
            existing = self.lookup(handle)
            if existing is not None:
                return self._reuse(existing, requested), False
            with self._lock:
                try:
                    plan, record = self._plan_acquire(handle, pool_sets, requested, attrs)
                except AddressExhausted:  # maybe only in our cache: re-read the pools once
                    plan, record = self._plan_acquire(handle, pool_sets, requested, attrs,
                                                      fresh=True)
                if self._commit(plan):
                    return record, True
        raise AssertionError("unreachable: _attempts raises when attempts run out")

    def _reuse(self, existing: HandleRecord, requested: Mapping[int, IPAddr]) -> HandleRecord:
        held = {ip.ip for ip in existing.ips}
        missing = sorted(str(ip) for ip in requested.values() if str(ip) not in held)
        if missing:
            raise AddressConflict(f"{existing.handle} already holds {', '.join(sorted(held))}",
                                  f"requested {', '.join(missing)}; DEL the attachment first")
        return existing

    def _plan_acquire(self, handle: HandleId, pool_sets: tuple[tuple[Pool, ...], ...],
                      requested: Mapping[int, IPAddr],
                      attrs: Mapping[str, str],
                      fresh: bool = False) -> tuple[Plan, HandleRecord]:
        plan = Plan()
        leased = []
        for index, pools in enumerate(pool_sets):
            states = [self.cache.state(p, fresh=fresh) for p in pools]
            if index in requested:
                state, choice, revision, block = self._choose_requested(states, requested[index],
                                                                        handle)
            else:
                state, choice, revision, block = self._choose_free(states)
            address = str(choice.address)
            block = block.with_allocation(address, str(handle), advance=index not in requested)
            plan.write_block(block_key(state.pool.name, choice.block), revision, state.pool.name,
                             block)
            self._plan_pool(plan, state, handle.network)
            gateway = state.pool.gateway_for(choice.address)
            leased.append(LeasedIP(f"{address}/{state.pool.cidr.prefixlen}",
                                   str(gateway) if gateway else None, state.pool.name,
                                   str(choice.block)))
        record = HandleRecord(handle, tuple(leased), attrs, self.clock())
        plan.compares[handle.key] = 0
        plan.puts[handle.key] = record.to_bytes()
        return plan, record

    def _choose_free(self, states: list[PoolState]) -> tuple[PoolState, Choice, int, BlockRecord]:
        pools = tuple(s.pool for s in states)
        choice = choose_address(pools, {s.pool.name: s.own_blocks() for s in states},
                                {s.pool.name: s.taken for s in states})
        if choice is None:
            ranges = ", ".join(s.pool.describe() for s in states)
            raise AddressExhausted(f"no address left in range {ranges} for node {self.node}",
                                   "; ".join(describe_blocks(s) for s in states))
        state = next(s for s in states if s.pool.name == choice.pool.name)
        if choice.claim:
            return state, choice, 0, self._new_block(state.pool, str(choice.block))
        revision, block = state.own[str(choice.block)]
        return state, choice, revision, block

    def _choose_requested(self, states: list[PoolState], ip: IPAddr,
                          handle: HandleId) -> tuple[PoolState, Choice, int, BlockRecord]:
        pool = find_pool(tuple(s.pool for s in states), ip)
        if pool is None:  # the netconf validation maps every request to a range set
            raise AddressExhausted(f"requested address {ip} is in no pool of node {self.node}")
        state = next(s for s in states if s.pool.name == pool.name)
        if pool.disabled:
            raise AddressExhausted(f"requested address {ip} is in disabled pool {pool.name}")
        block_net = block_containing(pool, ip)
        revision, block = self.cache.read_block(pool.name, str(block_net))
        holder = block.allocations.get(str(ip)) if block else None
        if holder is not None:
            raise AddressConflict(f"requested address {ip} is already held by {holder}",
                                  f"{handle} gets nothing; release {holder} first")
        if block is None:
            block = self._new_block(pool, str(block_net))
        return state, Choice(pool, block_net, ip, claim=revision == 0), revision, block

    def _new_block(self, pool: Pool, cidr: str) -> BlockRecord:
        return BlockRecord(pool=pool.name, cidr=cidr, affinity=self.node,
                           claimed_at=self.clock())

    def _plan_pool(self, plan: Plan, state: PoolState, network: str) -> None:
        """Compare the pool record as cached; write it when absent or its ranges changed."""
        key = pool_key(state.pool.name)
        plan.compares[key] = state.record_rev
        desired = merge_pool_record(state.config, network, state.record)
        if desired != state.record:
            plan.puts[key] = encode(desired)
            plan.pools[state.pool.name] = desired

    # -- DEL -------------------------------------------------------------------------------
    def release(self, handle: HandleId) -> HandleRecord | None:
        """Free every address ``handle`` holds and delete it; None when it holds nothing."""
        for _ in self._attempts(f"release of {handle}"):
            kv = self.store.get(handle.key)
            if kv is None:
                return None
            record = HandleRecord.from_bytes(kv.key, kv.value)
            with self._lock:
                if self._commit(self._plan_release(record, kv.mod_revision)):
                    return record
        raise AssertionError("unreachable: _attempts raises when attempts run out")

    def _plan_release(self, record: HandleRecord, revision: int) -> Plan:
        plan = Plan(compares={record.handle.key: revision}, deletes=[record.handle.key])
        for ip in record.ips:
            key = block_key(ip.pool, ip.block)
            if key in plan.blocks:
                block_rev, block = plan.compares[key], plan.blocks[key][2]
            else:
                block_rev, block = self.cache.read_block(ip.pool, ip.block)
            if block is not None and block.allocations.get(ip.ip) == str(record.handle):
                plan.write_block(key, block_rev, ip.pool, block.without(ip.ip))
        return plan

    # -- the txn ---------------------------------------------------------------------------
    def _commit(self, plan: Plan) -> bool:
        compares = [Compare(k, r) for k, r in plan.compares.items()]
        result = self.store.txn(compares, plan.ops())
        if result.succeeded:
            for pool, cidr, block in plan.blocks.values():
                self.cache.note_block(pool, cidr, result.revision, block)
            for pool, record in plan.pools.items():
                self.cache.note_pool(pool, result.revision, record)
            return True
        self.on_conflict()
        for key in plan.compares:
            self.cache.refresh(key, self.store.get(key))
        return False

    def _attempts(self, what: str) -> Iterator[int]:
        for attempt in range(self.attempts):
            if attempt:
                backoff(attempt)
            yield attempt
        raise TryAgainLater(f"could not commit the {what} after {self.attempts} attempts",
                            f"the store {self.store.name} is contended; retry")

    # -- GC and STATUS ---------------------------------------------------------------------
    def collect_garbage(self, network: str,
                        valid: Collection[tuple[str, str]] | None) -> list[HandleId]:
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
            raise type(first)(f"GC of network {network} failed for {len(errors)} handle(s)",
                              "; ".join(str(e) for e in errors))
        return released

    def ensure_capacity(self, network: str, range_sets: RangeSets) -> None:
        """NotAvailable (50) unless every range set still has an address for this node.
        Re-reads the pools' blocks, so it also resynchronises the cache."""
        for ranges in range_sets:
            with self._lock:
                states = [self.cache.state(p, fresh=True) for p in calc_pools(network, ranges)]
                if choose_address(tuple(s.pool for s in states),
                                  {s.pool.name: s.own_blocks() for s in states},
                                  {s.pool.name: s.taken for s in states}) is None:
                    ranges_text = ", ".join(s.pool.describe() for s in states)
                    raise NotAvailable(f"no address left in range {ranges_text} for node "
                                       f"{self.node}", "; ".join(describe_blocks(s)
                                                                  for s in states))

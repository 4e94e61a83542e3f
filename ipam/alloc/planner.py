"""Plans leases into a txn: the allocation policy (``policy``) applied to the cached store.

Every function adds one caller's reads and writes to a ``Plan``; it never writes itself. The
lease service runs them under its lock, through the combiner; other services (the outage
buffer) can compose them the same way: ``service.run(lambda plan: planner.plan_...(plan, ...))``.
A block written earlier in the same plan is seen with that write (``PlanView``, with the
reads of ``PlanReads`` in ``ipam.alloc.plan_view``), so one txn can hold many allocations of
one block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from functools import lru_cache

from cni.spec.errors import AddressConflict, AddressExhausted, InternalError, InvalidConfig
from ipam.alloc.allocator import IPAddr, Pool, Range, calc_pools, merge_pool_record
from ipam.alloc.plan import Plan
from ipam.alloc.plan_view import PlanReads, PlanView
from ipam.alloc.policy import CLAIM, Choice, choose_address
from ipam.alloc.pool_cache import PoolCache, PoolState, describe_blocks
from ipam.alloc.selection import (
    RequestedIP,
    Selection,
    assign_requested,
    missing_gateway,
    select_by_labels,
    select_by_name,
)
from ipam.records import BlockRecord, HandleId, HandleRecord, LeasedIP
from store.keys import affinity_key, block_key, pool_key

StateSets = tuple[tuple[PoolState, ...], ...]


@lru_cache(maxsize=256)
def netconf_pools(network: str, range_set: tuple[Range, ...]) -> tuple[Pool, ...]:
    """The netconf pools of a range set (memoised: the same netconf gives the same pools)."""
    return calc_pools(network, range_set)


class Planner(PlanReads):
    """The allocation policy of ``node`` (its ``labels`` select cluster pools) as plans."""

    def __init__(
        self, cache: PoolCache, node: str, labels: Mapping[str, str], clock: Callable[[], float]
    ) -> None:
        super().__init__(cache, node)
        self.labels, self.clock = dict(labels), clock

    # -- which pools -----------------------------------------------------------------------
    def pool_sets(self, selection: Selection, fresh: bool = False) -> StateSets:
        if not fresh:
            self.cache.sync()  # another writer's pool change counts from this request on
        if selection.mode == "ranges":
            return tuple(
                tuple(
                    self.cache.netconf_state(p, fresh)
                    for p in netconf_pools(selection.network, ranges)
                )
                for ranges in selection.range_sets
            )
        pools = self.cache.cluster_pools(fresh)
        if selection.mode == "pools":
            for name in selection.pools:
                if name in self.cache.bad_records:
                    raise self.cache.bad_records[name]
            if not fresh and not set(selection.pools) <= set(pools):
                pools = self.cache.cluster_pools(fresh=True)
            sets = select_by_name(selection.pools, pools)
        else:
            sets = select_by_labels(pools.values(), self.labels, self.node)
        return tuple(
            tuple(self.cache.cluster_state(p.name, fresh) for p in pool_set) for pool_set in sets
        )

    # -- ADD -------------------------------------------------------------------------------
    def plan_acquire(
        self,
        plan: Plan,
        handle: HandleId,
        selection: Selection,
        requested: Iterable[RequestedIP],
        attributes: Mapping[str, str],
    ) -> tuple[HandleRecord, bool]:
        """Lease one address per set to ``handle`` (or find the lease it holds); (record,
        created). Before refusing ("exhausted", or a pool setting that forbids it) the pools
        are re-read from the store once: a refusal never rests on a cached pool record."""
        existing = self.existing_handle(plan, handle)
        if existing is not None:
            return check_reuse(existing, requested), False
        draft = plan.fork()
        try:
            record = self._plan_new(draft, handle, selection, requested, attributes, False)
        except (AddressExhausted, InvalidConfig):
            draft = plan.fork()
            record = self._plan_new(draft, handle, selection, requested, attributes, True)
        plan.adopt(draft)
        return record, True

    def _plan_new(
        self,
        plan: Plan,
        handle: HandleId,
        selection: Selection,
        requested: Iterable[RequestedIP],
        attributes: Mapping[str, str],
        fresh: bool,
    ) -> HandleRecord:
        sets = self.pool_sets(selection, fresh)
        wanted = assign_requested(
            tuple(tuple(s.pool for s in states) for states in sets), requested
        )
        leased, owners = [], []
        for index, states in enumerate(sets):
            if index in wanted:
                lease, owner = self.plan_static(plan, str(handle), states, wanted[index])
            else:
                lease, owner = self.plan_address(plan, str(handle), states)
            if selection.gateway_key and lease.gateway is None:  # the draft is never adopted
                raise missing_gateway(lease.pool, lease.ip, selection.gateway_key)
            leased.append(lease)
            owners += [owner] if owner else []
        attrs = {**attributes, "node": self.node}
        if owners:
            attrs["borrowedFrom"] = ",".join(sorted(set(owners)))
        record = HandleRecord(handle, tuple(leased), attrs, self.clock())
        plan.put_handle(record, 0)
        return record

    def plan_address(
        self, plan: Plan, holder: str, states: tuple[PoolState, ...]
    ) -> tuple[LeasedIP, str | None]:
        """One address from the first of ``states`` that has one for this node; (lease, owner
        node when borrowed). AddressExhausted naming the pools and the node when none has."""
        now = self.clock()
        choice = choose_address(
            [s.pool for s in states], PlanView(self, plan, states), self.node, now
        )
        if choice is None:
            raise exhausted(states, self.node)
        state = next(s for s in states if s.pool is choice.pool)
        return self._allocate(plan, state, choice, holder, advance=True, now=now)

    def plan_static(
        self, plan: Plan, holder: str, states: tuple[PoolState, ...], ip: IPAddr
    ) -> tuple[LeasedIP, str | None]:
        """The requested ``ip``; AddressConflict naming whoever holds it."""
        state = next((s for s in states if s.pool.allocatable(ip)), None)
        if state is None:
            raise InvalidConfig(f"requested address {ip} is in no pool of node {self.node}")
        if state.pool.disabled:
            raise AddressExhausted(f"requested address {ip} is in disabled pool {state.name}")
        cidr = state.pool.block_of(ip)
        _, block = self.block_for_write(plan, state.name, str(cidr))
        current = block.allocations.get(str(ip)) if block else None
        if current is not None and not plan.pending_block(block_key(state.name, str(cidr)))[0]:
            block = self.reread_block(state.name, str(cidr))  # the cache may lag: ask the store
            current = block.allocations.get(str(ip)) if block else None
        if current is not None:
            raise AddressConflict(
                f"requested address {ip} is already held by {current}",
                f"{holder} gets nothing; {self.describe_holder(current)}",
            )
        kind = CLAIM if block is None else ("own" if block.affinity == self.node else "borrow")
        return self._allocate(
            plan,
            state,
            Choice(state.pool, cidr, ip, kind),
            holder,
            advance=False,
            now=self.clock(),
        )

    def _allocate(
        self, plan: Plan, state: PoolState, choice: Choice, holder: str, advance: bool, now: float
    ) -> tuple[LeasedIP, str | None]:
        cidr = str(choice.block)
        key = block_key(state.name, cidr)
        revision, block = self.block_for_write(plan, state.name, cidr)
        if choice.kind == CLAIM and block is not None:  # claimed by another node meanwhile:
            revision, block = 0, None  # compare "absent", lose the txn, re-read, plan again
        if block is None:
            block = BlockRecord(pool=state.name, cidr=cidr, affinity=self.node, claimed_at=now)
            plan.put_affinity(
                affinity_key(self.node, state.name, cidr),
                state.indexed.get(cidr, 0),
                state.name,
                cidr,
                now,
            )
            plan.events.append(("claim", state.name))
        if str(choice.address) in block.allocations:  # the policy saw another block value
            raise InternalError(
                f"allocator bug: {choice.address} chosen but held by "
                f"{block.allocations[str(choice.address)]}"
            )
        address = str(choice.address)
        owner = block.affinity if block.affinity != self.node else None
        if owner:
            plan.events.append(("borrow", state.name))
        block = block.pruned(now, state.pool.reuse_delay).with_allocation(
            address, holder, advance=advance, borrower=self.node
        )
        plan.write_block(key, revision, state.name, block)
        self.plan_pool_record(plan, state)
        gateway = state.pool.gateway_for(choice.address)
        return LeasedIP(
            f"{address}/{state.pool.cidr.prefixlen}",
            str(gateway) if gateway else None,
            state.name,
            cidr,
        ), owner

    def plan_pool_record(self, plan: Plan, state: PoolState) -> None:
        """Compare the pool record as cached; write a netconf pool's record when it is absent
        or its ranges changed."""
        key = pool_key(state.name)
        plan.compare(key, state.record_rev)
        if state.base is None or state.name in plan.pools:
            return
        desired = merge_pool_record(state.base, state.base.spec.network or "", state.record)
        if desired != state.record:
            plan.put_pool(key, state.record_rev, state.name, desired)

    # -- DEL -------------------------------------------------------------------------------
    def plan_release(self, plan: Plan, handle: HandleId) -> HandleRecord | None:
        """Free every address ``handle`` holds and delete it; None when it holds nothing.

        A block that does not show the address as the handle's is compared all the same: the
        cache may not know a txn whose reply was lost (an in-doubt ADD rolled back), and the
        handle must not go while its address stays held in the store."""
        key = handle.key
        revision, record = self.current_handle(plan, key)
        if record is None:
            return None
        now = self.clock()
        for ip in record.ips:
            block_rev, block = self.block_for_write(plan, ip.pool, ip.block)
            if block is None or block.allocations.get(ip.ip) != str(handle):
                plan.compare(block_key(ip.pool, ip.block), block_rev)
                continue
            block = block.without(ip.ip, released_at=now)
            state = self.cache.states.get(ip.pool)
            if state is not None:
                block = block.pruned(now, state.pool.reuse_delay)
            plan.write_block(block_key(ip.pool, ip.block), block_rev, ip.pool, block)
        plan.delete_handle(key, revision)
        return record

    # -- housekeeping ----------------------------------------------------------------------
    def plan_return_empty(self, plan: Plan, grace: float, limit: int = 40) -> list[str]:
        """Give back this node's blocks that have been empty for ``grace`` seconds and hold
        no address in its reuse delay (block and affinity deleted, both compared)."""
        now = self.clock()
        returned: list[str] = []
        for state in list(self.cache.states.values()):
            for cidr, (revision, block) in list(state.own.items()):
                key = block_key(state.name, cidr)
                if len(returned) >= limit or key in plan.blocks or block.allocations:
                    continue
                if block.empty_since is None:  # emptied before blocks kept the time
                    plan.write_block(key, revision, state.name, replace(block, empty_since=now))
                elif now - block.empty_since >= grace and not block.cooling(
                    now, state.pool.reuse_delay
                ):
                    plan.delete_block(key, revision, state.name, cidr)
                    plan.delete_affinity(
                        affinity_key(self.node, state.name, cidr),
                        state.indexed.get(cidr, 0),
                        state.name,
                        cidr,
                    )
                    plan.events.append(("return", state.name))
                    returned.append(f"{state.name} {cidr}")
        return returned


def check_reuse(existing: HandleRecord, requested: Iterable[RequestedIP]) -> HandleRecord:
    """A repeated ADD returns the lease, unless it asks for addresses the lease lacks."""
    held = {ip.ip for ip in existing.ips}
    asked = {str(getattr(item, "ip", item)) for item in requested}
    missing = sorted(asked - held)
    if missing:
        raise AddressConflict(
            f"{existing.handle} already holds {', '.join(sorted(held))}",
            f"requested {', '.join(missing)}; DEL the attachment first",
        )
    return existing


def exhausted(states: tuple[PoolState, ...], node: str) -> AddressExhausted:
    details = "; ".join(describe_blocks(s) for s in states)
    names = ", ".join(s.name for s in states)
    if all(s.base is not None for s in states):  # netconf ranges: name them as configured
        ranges = ", ".join(s.pool.describe() for s in states)
        return AddressExhausted(
            f"no address left in range {ranges} for node {node} (pool {names})", details
        )
    return AddressExhausted(f"no address left in pool {names} for node {node}", details)

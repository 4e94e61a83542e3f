"""The store side of the outage buffer, planned into the lease service's txns (``Plan``).

A node's buffer for one pool is a normal handle, ``/pycni/v1/handles/_buffer/<node>/<pool>``
(attribute ``node`` = the node, so check, GC and ``release-node`` understand it), holding
addresses reserved for ADDs served while the store is unreachable. Both jobs run through
``LeaseService.run`` (the node lock, one txn comparing every key read, the cache kept current,
retried on conflict):

- ``plan_refill``: top the buffer up to ``size`` addresses, chosen by the normal policy (own
  blocks, claiming one if needed, never borrowed from another node's block);
- ``plan_replay``: an ADD served during an outage: move its addresses from the buffer handle
  to the real handle (created, or added to if an in-doubt ADD had created it: nothing that a
  container may use is freed). ``cancelled`` (its DEL was journalled before the write-back):
  the addresses just leave the buffer, with their reuse delay. An address the buffer no longer
  holds is taken if free; held by someone else, it is reported as a conflict and not written.
"""

from __future__ import annotations

from collections.abc import Callable

from cni.spec.errors import AddressExhausted
from ipam.alloc.plan import Plan
from ipam.alloc.planner import Planner
from ipam.records import BlockRecord, HandleId, HandleRecord, LeasedIP
from store.base import Store
from store.keys import BUFFER_NETWORK, affinity_key, block_key, handles_prefix

BUFFER_ROLE = "outage-buffer"


def buffer_handle(node: str, pool: str) -> HandleId:
    return HandleId(BUFFER_NETWORK, node, pool)


def buffers_prefix(node: str) -> str:
    return f"{handles_prefix(BUFFER_NETWORK)}{node}/"


def read_buffers(store: Store, node: str) -> dict[str, HandleRecord]:
    """The node's buffer handles by pool."""
    return {
        record.handle.ifname: record
        for record in (
            HandleRecord.from_bytes(kv.key, kv.value) for kv in store.range(buffers_prefix(node))
        )
    }


def with_ips(record: HandleRecord, ips: tuple[LeasedIP, ...]) -> HandleRecord:
    return HandleRecord(record.handle, ips, record.attributes, record.created_at)


def put_or_delete(plan: Plan, revision: int, record: HandleRecord) -> None:
    if record.ips:
        plan.put_handle(record, revision)
    elif revision:
        plan.delete_handle(record.handle.key, revision)


def plan_refill(
    planner: Planner, plan: Plan, pool: str, size: int, clock: Callable[[], float]
) -> HandleRecord | None:
    """Add addresses to the buffer of ``pool`` up to ``size``; the buffer as planned. A pool
    the cache does not know yet: a cluster pool is read now, a netconf pool (defined only by
    the netconf) waits for the next ADD that uses it."""
    state = planner.cache.states.get(pool)
    if state is None and pool in planner.cache.cluster_pools():
        state = planner.cache.cluster_state(pool)
    holder = buffer_handle(planner.node, pool)
    revision, current = planner.current_handle(plan, holder.key)
    have = current.ips if current else ()
    if state is None or len(have) >= size:
        return current
    picks: list[LeasedIP] = []
    while len(have) + len(picks) < size:
        draft = plan.fork()
        try:
            lease, owner = planner.plan_address(draft, str(holder), (state,))
        except AddressExhausted:
            break
        if owner is not None:  # a borrowed address would not be the node's own
            break
        plan.adopt(draft)
        picks.append(lease)
    if not picks:
        return current
    record = HandleRecord(
        holder,
        tuple(have) + tuple(picks),
        {"node": planner.node, "role": BUFFER_ROLE},
        current.created_at if current else clock(),
    )
    plan.put_handle(record, revision)
    return record


def plan_replay(
    planner: Planner, plan: Plan, served: HandleRecord, cancelled: bool, now: float
) -> list[str]:
    """Write one buffer-served ADD back (see the module doc); returns the conflicts."""
    existing = None
    if not cancelled:
        existing = planner.current_handle(plan, served.handle.key)
    held = list(existing[1].ips) if existing and existing[1] else []
    conflicts, moved = [], False
    for ip in served.ips:
        buffer_id = take_from_buffer(planner, plan, ip)
        if any(h.ip == ip.ip for h in held):
            continue  # already in the real handle (a replay after a crash)
        revision, block = planner.block_for_write(plan, ip.pool, ip.block)
        holder = block.allocations.get(ip.ip) if block else None
        if cancelled:
            if block is not None and holder == str(buffer_id):
                plan.write_block(
                    block_key(ip.pool, ip.block),
                    revision,
                    ip.pool,
                    block.without(ip.ip, released_at=now),
                )
        elif holder in (None, str(buffer_id), str(served.handle)):
            block = block or new_block(planner, plan, ip, now)
            plan.write_block(
                block_key(ip.pool, ip.block),
                revision,
                ip.pool,
                block.with_allocation(
                    ip.ip, str(served.handle), advance=False, borrower=planner.node
                ),
            )
            held.append(ip)
            moved = True
        else:
            conflicts.append(
                f"{ip.ip}, served to {served.handle} during the outage, is held by {holder}"
            )
    if moved:
        old = existing[1] if existing and existing[1] else None
        attributes = {**(old.attributes if old else {}), **served.attributes}
        record = HandleRecord(
            served.handle, tuple(held), attributes, old.created_at if old else served.created_at
        )
        plan.put_handle(record, existing[0] if existing else 0)
    return conflicts


def take_from_buffer(planner: Planner, plan: Plan, ip: LeasedIP) -> HandleId:
    """Drop ``ip`` from the buffer handle that lists it (if it still does)."""
    buffer_id = buffer_handle(planner.node, ip.pool)
    revision, buffer = planner.current_handle(plan, buffer_id.key)
    if buffer is not None and any(b.ip == ip.ip for b in buffer.ips):
        put_or_delete(
            plan, revision, with_ips(buffer, tuple(b for b in buffer.ips if b.ip != ip.ip))
        )
    return buffer_id


def new_block(planner: Planner, plan: Plan, ip: LeasedIP, now: float) -> BlockRecord:
    """The block went (returned to the pool meanwhile) and nobody claimed it: claim it again,
    with its affinity index entry, both compared absent."""
    index = affinity_key(planner.node, ip.pool, ip.block)
    found = planner.cache.store.get(index)
    plan.put_affinity(index, found.mod_revision if found else 0, ip.pool, ip.block, now)
    return BlockRecord(pool=ip.pool, cidr=ip.block, affinity=planner.node, claimed_at=now)

"""Operator writes over a Store: gc's fixes and ``release IP``, each one CAS txn.

Every change is planned from the keys as they are *now* (a second look after the snapshot the
finding came from) and commits only if none of them moved since (``Compare`` on each key's
mod_revision, 0 = must still be absent). A fix whose reason is gone by then is skipped, never
forced: gc can run next to busy nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from cni.spec.errors import TryAgainLater
from ipam.ops.check import Fix
from ipam.ops.edits import block_at, block_with, block_without, handle_at, handle_without, lists
from ipam.ops.inspect import Snapshot, parse_snapshot
from ipam.records import AffinityRecord, BlockRecord, HandleRecord
from store.base import PREFIX, Compare, Delete, Op, Put, Store
from store.cas import LOST, Lost, Retry, run_cas
from store.codec import CorruptRecord, decode
from store.keys import BLOCKS, block_affinity_key, handle_key, is_buffer_handle, pool_key

MAX_ATTEMPTS = 5
RETRY = Retry(MAX_ATTEMPTS, base=0.01, linear=True)  # 10 ms, 20 ms ... between attempts
Current = dict[str, tuple[int, dict | None]]  # key -> (mod_revision, decoded JSON or None)


class Record(Protocol):
    def to_bytes(self) -> bytes: ...


@dataclass
class Change:
    """One txn: compare every key read, then put/delete."""

    compares: dict[str, int] = field(default_factory=dict)
    puts: dict[str, Record] = field(default_factory=dict)
    deletes: list[str] = field(default_factory=list)


class Skip(Exception):
    """The reason for a fix is gone (or never was): nothing to write."""


class Contended(TryAgainLater):
    """The keys of one change kept moving under it (not a store failure)."""


def read_snapshot(store: Store) -> Snapshot:
    """Everything under /pycni/v1/ in one range (one revision on etcd)."""
    range_at = getattr(store, "range_at", None)
    if range_at is not None:
        kvs, revision = range_at(PREFIX)
    else:
        kvs, revision = store.range(PREFIX), store.revision()
    return parse_snapshot(kvs, revision)


def read(store: Store, keys: list[str]) -> Current:
    out: Current = {}
    for key in dict.fromkeys(keys):
        kv = store.get(key)
        try:
            out[key] = (kv.mod_revision, decode(key, kv.value)) if kv else (0, None)
        except CorruptRecord as exc:
            raise Skip(f"{key} is corrupt: {exc.details}") from None
    return out


def commit(store: Store, change: Change) -> bool:
    ops: list[Op] = [
        *(Put(k, v.to_bytes()) for k, v in change.puts.items()),
        *(Delete(k) for k in change.deletes),
    ]
    return store.txn([Compare(k, r) for k, r in change.compares.items()], ops).succeeded


def apply_with_retry(
    store: Store, keys: list[str], plan: Callable[[Current], Change], what: str
) -> Change:
    """Read ``keys``, plan, commit; again on a lost compare. Skip propagates."""

    def attempt() -> Change | Lost:
        change = plan(read(store, keys))
        return change if commit(store, change) else LOST

    return run_cas(
        attempt,
        RETRY,
        Contended(
            f"{what}: the keys kept changing ({MAX_ATTEMPTS} attempts)",
            f"store {store.name}; retry",
        ),
    )


def pool_key_of(block_key: str) -> str:
    return pool_key(block_key[len(BLOCKS) :].rpartition("/")[0])


def current_handle(cur: Current, handle_id: str) -> HandleRecord | None:
    key = handle_key(handle_id)
    return handle_at(key, cur[key][1])


def fix_keys(fix: Fix) -> list[str]:
    """Every key the fix reads (and compares): block, handles, pool, affinity index."""
    keys = [k for k in (fix.block_key,) if k]
    keys += [handle_key(h) for h in (fix.handle, fix.holder) if h]
    if fix.block_key and fix.action in ("restore", "delete-block"):
        keys.append(pool_key_of(fix.block_key))
    if fix.block_key and fix.node:
        keys.append(block_affinity_key(fix.node, fix.block_key))
    return keys


def plan_fix(fix: Fix, cur: Current, now: float) -> Change:
    change = Change(compares={k: rev for k, (rev, _) in cur.items()})
    block = block_at(fix.block_key, cur[fix.block_key][1]) if fix.block_key else None
    handle = current_handle(cur, fix.handle) if fix.handle else None
    planner = PLANNERS[fix.action]
    planner(fix, cur, block, handle, change, now)
    return change


def allocations_of(block: BlockRecord | None) -> Mapping[str, str]:
    return block.allocations if block else {}


def required(value: str | None, field_name: str, fix: Fix) -> str:
    """A field the fix's action plans with; ``ipam.ops.check`` sets every one an action
    needs, so a fix without it is malformed (``apply_fix`` skips it as unusable)."""
    if value is None:
        raise TypeError(f"a {fix.action} fix without {field_name}")
    return value


def plan_free(
    fix: Fix,
    cur: Current,
    block: BlockRecord | None,
    handle: HandleRecord | None,
    change: Change,
    now: float,
) -> None:
    ip, holder = required(fix.ip, "ip", fix), required(fix.holder, "holder", fix)
    block_key = required(fix.block_key, "block_key", fix)
    # no block: no allocation to the holder either
    if (
        block is None
        or allocations_of(block).get(ip) != holder
        or lists(current_handle(cur, holder), ip, block_key)
    ):
        raise Skip("the allocation changed or its handle lists it now")
    change.puts[block_key] = block_without(block, [ip], now)


def plan_repoint(
    fix: Fix,
    cur: Current,
    block: BlockRecord | None,
    handle: HandleRecord | None,
    change: Change,
    now: float,
) -> None:
    ip, holder = required(fix.ip, "ip", fix), required(fix.holder, "holder", fix)
    block_key = required(fix.block_key, "block_key", fix)
    handle_id = required(fix.handle, "handle", fix)
    # no block: no allocation to the holder; no handle: it lists nothing
    if (
        block is None
        or handle is None
        or allocations_of(block).get(ip) != holder
        or not lists(handle, ip, block_key)
        or lists(current_handle(cur, holder), ip, block_key)
    ):
        raise Skip("the allocation or the handles changed")
    change.puts[block_key] = block_with(block, ip, handle_id, handle.node)


def plan_restore(
    fix: Fix,
    cur: Current,
    block: BlockRecord | None,
    handle: HandleRecord | None,
    change: Change,
    now: float,
) -> None:
    ip, block_key = required(fix.ip, "ip", fix), required(fix.block_key, "block_key", fix)
    handle_id = required(fix.handle, "handle", fix)
    if not lists(handle, ip, block_key):
        raise Skip("the handle no longer lists it")
    if block is None:
        if cur[pool_key_of(block_key)][1] is None:
            raise Skip(f"pool {fix.pool} is gone")
        pool, cidr = required(fix.pool, "pool", fix), required(fix.cidr, "cidr", fix)
        block = BlockRecord(pool, cidr, fix.node or "", claimed_at=now)
        if fix.node:  # the claim and its index entry together, as the allocator writes them
            change.puts[block_affinity_key(fix.node, block_key)] = AffinityRecord(pool, cidr, now)
    elif allocations_of(block).get(ip) is not None:
        raise Skip("the block holds it for someone now")
    change.puts[block_key] = block_with(block, ip, handle_id, fix.node or "")


def plan_drop(
    fix: Fix,
    cur: Current,
    block: BlockRecord | None,
    handle: HandleRecord | None,
    change: Change,
    now: float,
) -> None:
    ip, block_key = required(fix.ip, "ip", fix), required(fix.block_key, "block_key", fix)
    handle_id = required(fix.handle, "handle", fix)
    # no handle: it lists nothing
    if (
        handle is None
        or not lists(handle, ip, block_key)
        or allocations_of(block).get(ip) == handle_id
    ):
        raise Skip("the handle no longer lists it, or the block now gives it to this handle")
    put_or_delete_handle(change, handle_id, handle_without(handle, ip, fix.pool))


def plan_delete_handle(
    fix: Fix,
    cur: Current,
    block: BlockRecord | None,
    handle: HandleRecord | None,
    change: Change,
    now: float,
) -> None:
    if handle is None:
        raise Skip("already gone")
    pools = {item.pool for item in handle.ips}
    change.compares.update({pool_key(p): 0 for p in pools})  # still missing
    change.deletes.append(handle_key(required(fix.handle, "handle", fix)))


def plan_delete_block(
    fix: Fix,
    cur: Current,
    block: BlockRecord | None,
    handle: HandleRecord | None,
    change: Change,
    now: float,
) -> None:
    block_key = fix.block_key  # set whenever block is: plan_fix reads a block only then
    if (
        block is None
        or block_key is None
        or allocations_of(block)
        or cur[pool_key_of(block_key)][1] is not None
    ):
        raise Skip("the block is gone, holds addresses, or its pool exists again")
    change.deletes.append(block_key)
    index = block_affinity_key(fix.node, block_key) if fix.node else None
    if index and cur[index][1] is not None:
        change.deletes.append(index)


def plan_put_affinity(
    fix: Fix,
    cur: Current,
    block: BlockRecord | None,
    handle: HandleRecord | None,
    change: Change,
    now: float,
) -> None:
    node, block_key = required(fix.node, "node", fix), required(fix.block_key, "block_key", fix)
    index = block_affinity_key(node, block_key)
    if block is None or block.affinity != node or cur[index][1] is not None:
        raise Skip("the block or its index entry changed")
    change.puts[index] = AffinityRecord(block.pool, block.cidr, block.claimed_at or now)


def plan_delete_affinity(
    fix: Fix,
    cur: Current,
    block: BlockRecord | None,
    handle: HandleRecord | None,
    change: Change,
    now: float,
) -> None:
    node, block_key = required(fix.node, "node", fix), required(fix.block_key, "block_key", fix)
    index = block_affinity_key(node, block_key)
    if cur[index][1] is None or (block is not None and block.affinity == node):
        raise Skip("the index entry is gone or its block is this node's again")
    change.deletes.append(index)


PLANNERS = {
    "free": plan_free,
    "repoint": plan_repoint,
    "restore": plan_restore,
    "drop": plan_drop,
    "delete-handle": plan_delete_handle,
    "delete-block": plan_delete_block,
    "put-affinity": plan_put_affinity,
    "delete-affinity": plan_delete_affinity,
}


def put_or_delete_handle(change: Change, handle_id: str, record: HandleRecord) -> None:
    """A handle left with no address is deleted (an outage buffer's is kept, empty)."""
    if record.ips or is_buffer_handle(handle_id):
        change.puts[handle_key(handle_id)] = record
    else:
        change.deletes.append(handle_key(handle_id))


def apply_fix(store: Store, fix: Fix, now: float) -> tuple[str, str]:
    """("applied", ""), ("skipped", why) or ("failed", why); a store failure raises."""
    try:
        apply_with_retry(
            store,
            fix_keys(fix),
            lambda cur: plan_fix(fix, cur, now),
            f"gc {fix.action} of {fix.ip or fix.handle or fix.block_key}",
        )
    except Skip as why:
        return "skipped", str(why)
    except Contended as exc:
        return "failed", str(exc)
    except (AttributeError, TypeError, KeyError, ValueError) as exc:  # a malformed record
        return "skipped", f"a record it touches is unusable: {exc!r}"
    return "applied", ""

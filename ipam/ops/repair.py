"""Operator writes over a Store: gc's fixes and ``release IP``, each one CAS txn.

Every change is planned from the keys as they are *now* (a second look after the snapshot the
finding came from) and commits only if none of them moved since (``Compare`` on each key's
mod_revision, 0 = must still be absent). A fix whose reason is gone by then is skipped, never
forced: gc can run next to busy nodes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from cni.spec.errors import TryAgainLater
from ipam.ops.edits import (affinity_record, block_with, block_without, decoded, encode,
                        handle_without, new_block)
from ipam.ops.inspect import BLOCKS, HANDLES, POOLS, Snapshot, affinity_key, parse_snapshot
from ipam.ops.check import Fix
from ipam.store.base import PREFIX, Compare, Delete, Put, Store

MAX_ATTEMPTS = 5
Current = dict[str, tuple[int, dict | None]]


@dataclass
class Change:
    """One txn: compare every key read, then put/delete."""

    compares: dict[str, int] = field(default_factory=dict)
    puts: dict[str, dict] = field(default_factory=dict)
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
        try:
            out[key] = decoded(store.get(key))
        except ValueError as exc:
            raise Skip(f"{key} is corrupt: {exc}") from None
    return out


def commit(store: Store, change: Change) -> bool:
    ops = [*(Put(k, encode(v)) for k, v in change.puts.items()),
           *(Delete(k) for k in change.deletes)]
    return store.txn([Compare(k, r) for k, r in change.compares.items()], ops).succeeded


def apply_with_retry(store: Store, keys: list[str],
                     plan: Callable[[Current], Change], what: str) -> Change:
    """Read ``keys``, plan, commit; again on a lost compare. Skip propagates."""
    for attempt in range(MAX_ATTEMPTS):
        if attempt:
            time.sleep(0.01 * attempt)
        change = plan(read(store, keys))
        if commit(store, change):
            return change
    raise Contended(f"{what}: the keys kept changing ({MAX_ATTEMPTS} attempts)",
                    f"store {store.name}; retry")


def handle_key(handle_id: str) -> str:
    return f"{HANDLES}{handle_id}"


def lists(handle: dict | None, ip: str, block_key: str) -> bool:
    """Whether the handle record lists ``ip`` in the block at ``block_key``."""
    for item in (handle or {}).get("ips") or ():
        key = f"{BLOCKS}{item.get('pool')}/{str(item.get('block', '')).replace('/', '-')}"
        if str(item.get("address", "")).split("/")[0] == ip and key == block_key:
            return True
    return False


def pool_key_of(block_key: str) -> str:
    return f"{POOLS}{block_key[len(BLOCKS):].rpartition('/')[0]}"


def fix_keys(fix: Fix) -> list[str]:
    """Every key the fix reads (and compares): block, handles, pool, affinity index."""
    keys = [k for k in (fix.block_key,) if k]
    keys += [handle_key(h) for h in (fix.handle, fix.holder) if h]
    if fix.block_key and fix.action in ("restore", "delete-block"):
        keys.append(pool_key_of(fix.block_key))
    if fix.block_key and fix.node:
        keys.append(affinity_key(fix.node, fix.block_key))
    return keys


def plan_fix(fix: Fix, cur: Current, now: float) -> Change:
    change = Change(compares={k: rev for k, (rev, _) in cur.items()})
    block = cur[fix.block_key][1] if fix.block_key else None
    handle = cur[handle_key(fix.handle)][1] if fix.handle else None
    planner = PLANNERS[fix.action]
    planner(fix, cur, block, handle, change, now)
    return change


def allocations_of(block: dict | None) -> dict:
    return (block or {}).get("allocations") or {}


def plan_free(fix: Fix, cur: Current, block: dict | None, handle: dict | None,
              change: Change, now: float) -> None:
    if allocations_of(block).get(fix.ip) != fix.holder or \
            lists(cur[handle_key(fix.holder)][1], fix.ip, fix.block_key):
        raise Skip("the allocation changed or its handle lists it now")
    change.puts[fix.block_key] = block_without(block, [fix.ip], now)


def plan_repoint(fix: Fix, cur: Current, block: dict | None, handle: dict | None,
                 change: Change, now: float) -> None:
    if allocations_of(block).get(fix.ip) != fix.holder or not lists(handle, fix.ip,
                                                                    fix.block_key) \
            or lists(cur[handle_key(fix.holder)][1], fix.ip, fix.block_key):
        raise Skip("the allocation or the handles changed")
    node = str((handle.get("attributes") or {}).get("node") or "")
    change.puts[fix.block_key] = block_with(block, fix.ip, fix.handle, node)


def plan_restore(fix: Fix, cur: Current, block: dict | None, handle: dict | None,
                 change: Change, now: float) -> None:
    if not lists(handle, fix.ip, fix.block_key):
        raise Skip("the handle no longer lists it")
    if block is None:
        if cur[pool_key_of(fix.block_key)][1] is None:
            raise Skip(f"pool {fix.pool} is gone")
        block = new_block(fix.pool, fix.cidr, fix.node or "", now)
        if fix.node:  # the claim and its index entry together, as the allocator writes them
            change.puts[affinity_key(fix.node, fix.block_key)] = affinity_record(
                fix.pool, fix.cidr, now)
    elif allocations_of(block).get(fix.ip) is not None:
        raise Skip("the block holds it for someone now")
    change.puts[fix.block_key] = block_with(block, fix.ip, fix.handle, fix.node or "")


def plan_drop(fix: Fix, cur: Current, block: dict | None, handle: dict | None,
              change: Change, now: float) -> None:
    if not lists(handle, fix.ip, fix.block_key) or allocations_of(block).get(fix.ip) == fix.handle:
        raise Skip("the handle no longer lists it, or the block now gives it to this handle")
    put_or_delete_handle(change, fix.handle, handle_without(handle, fix.ip, fix.pool))


def plan_delete_handle(fix: Fix, cur: Current, block: dict | None, handle: dict | None,
                       change: Change, now: float) -> None:
    if handle is None:
        raise Skip("already gone")
    pools = {str(item.get("pool")) for item in handle.get("ips") or ()}
    change.compares.update({f"{POOLS}{p}": 0 for p in pools})  # still missing
    change.deletes.append(handle_key(fix.handle))


def plan_delete_block(fix: Fix, cur: Current, block: dict | None, handle: dict | None,
                      change: Change, now: float) -> None:
    if block is None or allocations_of(block) or cur[pool_key_of(fix.block_key)][1] is not None:
        raise Skip("the block is gone, holds addresses, or its pool exists again")
    change.deletes.append(fix.block_key)
    index = affinity_key(fix.node, fix.block_key) if fix.node else None
    if index and cur[index][1] is not None:
        change.deletes.append(index)


def plan_put_affinity(fix: Fix, cur: Current, block: dict | None, handle: dict | None,
                      change: Change, now: float) -> None:
    index = affinity_key(fix.node, fix.block_key)
    if block is None or block.get("affinity") != fix.node or cur[index][1] is not None:
        raise Skip("the block or its index entry changed")
    change.puts[index] = affinity_record(str(block.get("pool")), str(block.get("cidr")),
                                         float(block.get("claimedAt") or now))


def plan_delete_affinity(fix: Fix, cur: Current, block: dict | None, handle: dict | None,
                         change: Change, now: float) -> None:
    index = affinity_key(fix.node, fix.block_key)
    if cur[index][1] is None or (block is not None and block.get("affinity") == fix.node):
        raise Skip("the index entry is gone or its block is this node's again")
    change.deletes.append(index)


PLANNERS = {"free": plan_free, "repoint": plan_repoint, "restore": plan_restore,
            "drop": plan_drop, "delete-handle": plan_delete_handle,
            "delete-block": plan_delete_block, "put-affinity": plan_put_affinity,
            "delete-affinity": plan_delete_affinity}


def put_or_delete_handle(change: Change, handle_id: str, record: dict) -> None:
    """A handle left with no address is deleted (an outage buffer's is kept, empty)."""
    if record.get("ips") or handle_id.startswith("_buffer/"):
        change.puts[handle_key(handle_id)] = record
    else:
        change.deletes.append(handle_key(handle_id))


def apply_fix(store: Store, fix: Fix, now: float) -> tuple[str, str]:
    """("applied", ""), ("skipped", why) or ("failed", why); a store failure raises."""
    try:
        apply_with_retry(store, fix_keys(fix), lambda cur: plan_fix(fix, cur, now),
                         f"gc {fix.action} of {fix.ip or fix.handle or fix.block_key}")
    except Skip as why:
        return "skipped", str(why)
    except Contended as exc:
        return "failed", str(exc)
    except (AttributeError, TypeError, KeyError, ValueError) as exc:  # a malformed record
        return "skipped", f"a record it touches is unusable: {exc!r}"
    return "applied", ""

"""Pool CRUD over a Store (`pycni ipam pool add|set|rm|ls`), every write one CAS txn.

- add: the pool key must be absent, and every existing pool key plus the pool-set marker
  (``/pycni/v1/meta/pools``, bumped by every add and rm) are compared, so two operators adding
  overlapping pools at once cannot both win; overlap is checked against every pool, netconf
  pools included.
- set: only mutable settings; ``cidr`` and ``blockSize`` are immutable (blocks are cut by them).
- rm: refuses while a pod holds an address of the pool unless ``force``. First the pool is
  disabled (a CAS on its record: every allocation txn compares the pool record, so none can land
  after it), then outage-buffer reservations (and with force every allocation) are released
  block by block, the empty blocks deleted, and the record deleted comparing its revision.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from cni.spec.errors import AddressConflict, InvalidConfig, TryAgainLater
from ipam.alloc.pool_spec import PoolSpec, record_of
from ipam.ops.inspect import PoolView, Snapshot, parse_pool
from ipam.ops.pool_update import PoolUpdate, calc_updated_record, find_gateway_conflicts
from ipam.ops.release import CHUNK, release_in_block
from ipam.ops.repair import read_snapshot
from ipam.records import BlockRecord
from store.base import KV, Compare, Delete, Put, Store
from store.cas import LOST, Lost, Retry, run_cas
from store.codec import CorruptRecord, decode, encode
from store.keys import POOLS, block_affinity_key, blocks_prefix, is_buffer_handle, pool_key
from store.keys import POOLS_MARKER as MARKER

T = TypeVar("T")
MAX_ATTEMPTS = 5
RETRY = Retry(MAX_ATTEMPTS, base=0.02, linear=True)  # 20 ms, 40 ms ... between attempts


class PoolNotFound(InvalidConfig):
    pass


class PoolInUse(AddressConflict):
    pass


def list_pools(store: Store) -> list[PoolView]:
    return [parse_pool(kv) for kv in store.range(POOLS)]


def read_pool(store: Store, name: str) -> tuple[int, dict]:
    """An existing pool by name (netconf pools of IPv6 subnets have ':' in theirs)."""
    if not name or "/" in name:
        raise PoolNotFound(f"invalid pool name {name!r}", "see pycni ipam pool ls")
    kv = store.get(pool_key(name))
    if kv is None:
        raise PoolNotFound(f"pool {name} does not exist", "see pycni ipam pool ls")
    return kv.mod_revision, decode(kv.key, kv.value)


def attempts(what: str, store: Store, body: Callable[[], T | None]) -> T:
    """Run ``body`` until it returns non-None (a committed txn), a few times at most."""
    return run_cas(
        lambda: LOST if (result := body()) is None else result,
        RETRY,
        TryAgainLater(
            f"{what}: the pools kept changing ({MAX_ATTEMPTS} attempts)",
            f"store {store.name}; retry",
        ),
    )


def add_pool(store: Store, spec: PoolSpec) -> dict:
    """Create ``spec`` (made by ``pool_spec.make_pool``); returns the stored record."""

    def once() -> dict | None:
        marker = store.get(MARKER)  # before the list: a pool added in between moves it
        pools = list_pools(store)
        validate_new(store, spec, pools)
        record = record_of(spec)
        key = pool_key(spec.name)
        compares = [
            Compare(key, 0),
            Compare(MARKER, marker.mod_revision if marker else 0),
            *(Compare(pool_key(p.name), p.rev) for p in pools),
        ]
        ops = [Put(key, encode(record)), Put(MARKER, encode(marker_record("add", spec.name)))]
        return record if store.txn(compares, ops).succeeded else None

    return attempts(f"pool add {spec.name}", store, once)


def marker_record(action: str, name: str) -> dict:
    return {"action": action, "pool": name, "at": time.time()}


def validate_new(store: Store, spec: PoolSpec, pools: list[PoolView]) -> None:
    for other in pools:
        if other.name == spec.name:
            raise AddressConflict(
                f"pool {spec.name} already exists",
                f"cidr {other.record.get('cidr')}; change it with pycni ipam pool set",
            )
        if (
            other.spec is not None
            and other.spec.cidr.version == spec.cidr.version
            and other.spec.cidr.overlaps(spec.cidr)
        ):
            kind = (
                f"netconf pool of network {other.spec.network}" if other.spec.network else "pool"
            )
            raise AddressConflict(
                f"{spec.cidr} overlaps {kind} {other.name} ({other.spec.cidr})",
                "pools must not share addresses",
            )
    if store.range(blocks_prefix(spec.name), keys_only=True, limit=1):
        raise AddressConflict(
            f"blocks of an earlier pool {spec.name} are still stored",
            "run pycni ipam gc (or choose another name)",
        )


@dataclass
class SetResult:
    old: dict
    new: dict
    warnings: list[str] = field(default_factory=list)


def set_pool(store: Store, name: str, update: PoolUpdate) -> SetResult:
    def once() -> SetResult | None:
        rev, old = read_pool(store, name)
        new = calc_updated_record(old, update)
        compares = [Compare(pool_key(name), rev)]
        snap = read_snapshot(store) if update.needs_blocks(old, new) else None
        warnings: list[str] = []
        if snap is not None:
            conflicts = find_gateway_conflicts(snap, name, new)
            if conflicts:
                raise AddressConflict(
                    f"gateway first: block gateway address(es) of pool "
                    f"{name} are held: {', '.join(conflicts[:5])}",
                    "release them first (pycni ipam release IP)",
                )
            warnings = update.excluded_but_held(snap, name, new)
            compares += [Compare(b.key, b.rev) for b in snap.blocks_of(name)]
        if new == old:
            return SetResult(old, new, warnings)
        if store.txn(compares, [Put(pool_key(name), encode(new))]).succeeded:
            return SetResult(old, new, warnings)
        return None

    return attempts(f"pool set {name}", store, once)


def held_addresses(snap: Snapshot, name: str, buffers: bool) -> dict[str, set[str]]:
    """block key -> handles holding or listing addresses of pool ``name``;
    ``buffers``: only the outage buffers' (else only the others')."""
    found: dict[str, set[str]] = {}
    for block in snap.blocks_of(name):
        for holder in block.allocations.values():
            if is_buffer_handle(holder) == buffers:
                found.setdefault(block.key, set()).add(holder)
    for handle in snap.handles.values():
        if handle.is_buffer != buffers:
            continue
        for item in handle.ips:
            if item.pool == name:
                found.setdefault(item.block_key, set()).add(handle.id)
    return found


def describe_held(held: dict[str, set[str]]) -> str:
    handles = sorted(set().union(*held.values()))
    more = f" and {len(handles) - 5} more" if len(handles) > 5 else ""
    return f"{len(handles)} handle(s) in {len(held)} block(s): {', '.join(handles[:5])}{more}"


def set_disabled(store: Store, name: str, disabled: bool) -> None:
    def once() -> bool | None:
        rev, record = read_pool(store, name)
        if record.get("disabled") == disabled:
            return True
        ops = [Put(pool_key(name), encode({**record, "disabled": disabled}))]
        return True if store.txn([Compare(pool_key(name), rev)], ops).succeeded else None

    attempts(f"pool {'disable' if disabled else 'enable'} {name}", store, once)


def remove_pool(store: Store, name: str, force: bool = False, now: float | None = None) -> dict:
    """Delete the pool, its blocks and (with ``force``) every address of it from its handles."""
    now = time.time() if now is None else now
    _, record = read_pool(store, name)
    held = held_addresses(read_snapshot(store), name, buffers=False)
    if held and not force:
        raise PoolInUse(
            f"pool {name} still has addresses in use",
            f"{describe_held(held)}; release them or use --force",
        )
    was_disabled = bool(record.get("disabled"))
    set_disabled(store, name, True)
    snap = read_snapshot(store)
    held = held_addresses(snap, name, buffers=False)
    if held and not force:  # an ADD landed before the pool was disabled
        if not was_disabled:
            set_disabled(store, name, False)
        raise PoolInUse(f"pool {name} still has addresses in use", describe_held(held))
    released = release_all(store, snap, name, now)
    deleted = delete_blocks(store, name)

    def once() -> bool | None:
        rev, _ = read_pool(store, name)
        marker = store.get(MARKER)
        ok = store.txn(
            [Compare(pool_key(name), rev), Compare(MARKER, marker.mod_revision if marker else 0)],
            [Delete(pool_key(name)), Put(MARKER, encode(marker_record("rm", name)))],
        ).succeeded
        return True if ok else None

    attempts(f"pool rm {name}", store, once)
    return {"pool": name, "removed": True, "releasedAddresses": released, "deletedBlocks": deleted}


def release_all(store: Store, snap: Snapshot, name: str, now: float) -> int:
    """Free every address of the pool, one txn per block and chunk of handles."""
    count = 0
    targets = held_addresses(snap, name, buffers=True)
    for key, ids in held_addresses(snap, name, buffers=False).items():
        targets.setdefault(key, set()).update(ids)
    for block_key, ids in sorted(targets.items()):
        block = snap.blocks.get(block_key)
        ordered = sorted(ids)
        for start in range(0, max(len(ordered), 1), CHUNK):
            chunk = ordered[start : start + CHUNK]
            ips = {
                ip
                for h in chunk
                if h in snap.handles
                for ip in (i.ip for i in snap.handles[h].ips if i.block_key == block_key)
            }
            ips |= {ip for ip, h in (block.allocations.items() if block else ()) if h in chunk}
            if release_in_block(store, block_key, ips, chunk, now) is not None:
                count += len(ips)
    return count


def read_block(kv: KV) -> BlockRecord | None:
    try:
        return BlockRecord.from_bytes(kv.key, kv.value)
    except CorruptRecord:
        return None  # a corrupt block of a pool being removed goes with it


def delete_blocks(store: Store, name: str) -> int:
    """Delete the pool's blocks (all empty by now) with their affinity index entries, a
    chunk per txn, every key compared."""
    deleted = 0

    def attempt() -> int | Lost:  # one pass: delete what is left, then look again
        nonlocal deleted
        blocks = [(kv, read_block(kv)) for kv in store.range(blocks_prefix(name))]
        if not blocks:
            return deleted
        busy = [kv.key for kv, block in blocks if block and block.allocations]
        if busy:
            raise PoolInUse(
                f"pool {name}: block(s) still hold addresses: {', '.join(busy[:3])}",
                "a release lost a race; run the command again",
            )
        for start in range(0, len(blocks), CHUNK // 2):
            compares, ops = [], []
            for kv, block in blocks[start : start + CHUNK // 2]:
                compares.append(Compare(kv.key, kv.mod_revision))
                ops.append(Delete(kv.key))
                index = (
                    store.get(block_affinity_key(block.affinity, kv.key))
                    if block and block.affinity
                    else None
                )
                if index is not None:
                    compares.append(Compare(index.key, index.mod_revision))
                    ops.append(Delete(index.key))
            if store.txn(compares, ops).succeeded:
                deleted += len(blocks[start : start + CHUNK // 2])
        return LOST

    return run_cas(
        attempt,
        Retry(MAX_ATTEMPTS),
        TryAgainLater(f"pool rm {name}: its blocks kept changing", f"store {store.name}"),
    )

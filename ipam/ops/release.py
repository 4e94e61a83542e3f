"""Releasing addresses by hand: ``pycni ipam release IP`` and ``pool rm --force``.

One txn per block (per chunk of at most ``CHUNK`` handles): the block frees the addresses
(stamped in ``released`` for the reuse cooldown) and every handle listing them drops them, a
handle left with none is deleted; every key read is compared.
"""

from __future__ import annotations

import ipaddress
import time
from typing import Any

from cni.spec.errors import AddressConflict, InvalidConfig
from ipam.ops.edits import block_at, block_without, handle_at, handle_without, lists
from ipam.ops.inspect import Snapshot
from ipam.ops.repair import (
    Change,
    Current,
    Skip,
    apply_with_retry,
    put_or_delete_handle,
    read_snapshot,
)
from store.base import Store
from store.keys import handle_key

CHUNK = 100  # etcd allows 128 ops per txn


def parse_ip(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise InvalidConfig(
            f"invalid address {text!r}", "expected an IPv4 or IPv6 address (without prefix length)"
        ) from None


def holders_of(snap: Snapshot, ip: str, pool: str | None) -> dict[str, set[str]]:
    """block key -> handles involved (the block's holder and every handle listing ``ip``)."""
    found: dict[str, set[str]] = {}
    address = ipaddress.ip_address(ip)
    for block in snap.blocks.values():
        if address in block.net and ip in block.allocations:
            found.setdefault(block.key, set()).add(block.allocations[ip])
    for handle in snap.handles.values():
        for item in handle.ips:
            if item.ip == ip:
                found.setdefault(item.block_key, set()).add(handle.id)
    return {key: ids for key, ids in found.items() if pool is None or key.split("/")[-2] == pool}


def plan_release(
    block_key: str, ips: set[str], handle_ids: list[str], cur: Current, now: float
) -> Change:
    change = Change(compares={k: rev for k, (rev, _) in cur.items()})
    block = block_at(block_key, cur[block_key][1])
    held = {ip for ip in ips if block and ip in block.allocations}
    if block and held:
        change.puts[block_key] = block_without(block, sorted(held), now)
    pool = block_key.split("/")[-2]
    for handle_id in handle_ids:
        record = handle_at(handle_key(handle_id), cur[handle_key(handle_id)][1])
        if record is None:  # gone: it lists nothing to release
            continue
        listed = [ip for ip in sorted(ips) if lists(record, ip, block_key)]
        for ip in listed:
            record = handle_without(record, ip, pool)
        if listed:
            put_or_delete_handle(change, handle_id, record)
    if not change.puts and not change.deletes:
        raise Skip("nothing left to release")
    return change


def release_in_block(
    store: Store, block_key: str, ips: set[str], handle_ids: list[str], now: float
) -> Change | None:
    """Free ``ips`` in the block and drop them from ``handle_ids``; None: already done."""
    keys = [block_key, *(handle_key(h) for h in handle_ids)]
    try:
        return apply_with_retry(
            store,
            keys,
            lambda cur: plan_release(block_key, ips, handle_ids, cur, now),
            f"release in {block_key}",
        )
    except Skip:
        return None


def release_ip(
    store: Store, text: str, pool: str | None = None, now: float | None = None
) -> dict[str, Any]:
    ip = parse_ip(text)
    found = holders_of(read_snapshot(store), ip, pool)
    if not found:
        where = f" in pool {pool}" if pool else ""
        return {"ip": ip, "released": False, "reason": f"no block or handle holds it{where}"}
    if len(found) > 1:
        pools = sorted(key.split("/")[-2] for key in found)
        raise AddressConflict(
            f"{ip} is held in several pools: {', '.join(pools)}", "choose one with --pool"
        )
    ((block_key, handle_ids),) = found.items()
    change = release_in_block(
        store, block_key, {ip}, sorted(handle_ids), time.time() if now is None else now
    )
    if change is None:
        return {"ip": ip, "released": False, "reason": "released meanwhile"}
    return {
        "ip": ip,
        "released": True,
        "pool": block_key.split("/")[-2],
        "blockKey": block_key,
        "handles": sorted(handle_ids),
        "deletedHandles": sorted(k.split("/handles/", 1)[1] for k in change.deletes),
    }

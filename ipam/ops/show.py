"""`pycni ipam show` reports, pure: a snapshot in, a JSON-ready dict out.

- ``report_overview``: every pool with size/reserved/used/free/cooling/borrowed, every block
  with its node, and per node its blocks, the addresses used in them, and the handles (and
  their addresses) of its pods, and whether its heartbeat is alive;
- ``report_ip``: who holds an address (handle, pod, node, block) or why it is free, cooling
  or never handed out; every pool containing it is looked at (netconf pools of different
  networks may share a subnet);
- ``report_handle``: the handles matching ``network/containerID/ifname``,
  ``network/containerID`` or a bare containerID, with their addresses and attributes.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from ipam.alloc.pool_spec import IPAddr, PoolSpec, render_selector
from ipam.alloc.usage import calc_block_usage, calc_pool_usage, is_borrowed, is_cooling
from ipam.ops.inspect import BlockView, HandleView, Snapshot
from store.keys import HANDLES


def pool_summary(name: str, snap: Snapshot, now: float) -> dict[str, Any]:
    view = snap.pools[name]
    spec = view.spec
    if spec is None:
        return {"name": name, "error": view.error, "blocks": len(snap.blocks_of(name))}
    usage = calc_pool_usage(spec, snap.blocks_of(name), snap.handles, now)
    return {
        "name": name,
        "cidr": str(spec.cidr),
        "source": spec.source,
        "network": spec.network,
        "blockSize": spec.block_size,
        "disabled": spec.disabled,
        "strictAffinity": spec.strict_affinity,
        "gateway": spec.gateway,
        "nodeSelector": render_selector(spec.node_selector),
        "size": spec.size,
        "reserved": spec.reserved,
        "used": usage.used,
        "free": usage.free,
        "cooling": usage.cooling,
        "borrowed": usage.borrowed,
        "blocks": len(snap.blocks_of(name)),
    }


def block_summary(
    block: BlockView, spec: PoolSpec | None, snap: Snapshot, now: float
) -> dict[str, Any]:
    out: dict[str, Any] = {"pool": block.pool, "cidr": block.cidr, "node": block.affinity}
    if spec is None:
        return {**out, "used": len(block.allocations), "orphan": True}
    usage = calc_block_usage(spec, block, snap.handles, now)
    return {**out, **usage.to_dict(), "emptySince": block.empty_since}


def report_overview(snap: Snapshot, now: float) -> dict[str, Any]:
    blocks = [
        block_summary(b, snap.spec(b.pool), snap, now)
        for name in sorted({*snap.pools, *(b.pool for b in snap.blocks.values())})
        for b in snap.blocks_of(name)
    ]
    held = [h for h in snap.handles.values() if h.node]
    names = sorted(
        {b["node"] for b in blocks if b["node"]}
        | set(snap.nodes)
        | set(snap.alive)
        | {h.node for h in held}
    )
    nodes = [
        {
            "name": n,
            "alive": n in snap.alive,
            "registered": n in snap.nodes,
            "blocks": [f"{b['pool']}:{b['cidr']}" for b in blocks if b["node"] == n],
            "used": sum(b["used"] for b in blocks if b["node"] == n),
            "handles": sum(1 for h in held if h.node == n),
            "addresses": sum(len(h.ips) for h in held if h.node == n),
        }
        for n in names
    ]
    return {
        "revision": snap.revision,
        "pools": [pool_summary(name, snap, now) for name in sorted(snap.pools)],
        "blocks": blocks,
        "nodes": nodes,
    }


def holder_details(handle: HandleView | None) -> dict[str, Any]:
    if handle is None:
        return {"handleExists": False}
    attrs = handle.attributes
    return {
        "handleExists": True,
        "node": handle.node or None,
        "namespace": attrs.get("namespace"),
        "pod": attrs.get("pod"),
        "podUID": attrs.get("podUID"),
    }


def ip_in_pool(snap: Snapshot, spec: PoolSpec, ip: IPAddr, now: float) -> dict[str, Any]:
    block_net = spec.block_of(ip)
    out: dict[str, Any] = {"pool": spec.name, "block": str(block_net)}
    block = next((b for b in snap.blocks_of(spec.name) if b.net == block_net), None)
    out["blockNode"] = block.affinity if block else None
    holder = block.allocations.get(str(ip)) if block else None
    if block is not None and holder is not None:
        handle = snap.handles.get(holder)
        return {
            **out,
            "state": "allocated",
            "handle": holder,
            **holder_details(handle),
            "borrowed": is_borrowed(block, str(ip), handle),
        }
    reason = spec.unallocatable_reason(ip)
    if reason is not None:
        return {**out, "state": "reserved", "reason": reason}
    if block is not None and is_cooling(block, str(ip), spec.reuse_delay, now):
        released = block.released[str(ip)]
        return {
            **out,
            "state": "cooling",
            "releasedAt": released,
            "coolingUntil": released + spec.reuse_delay,
        }
    return {**out, "state": "free", "blockClaimed": block is not None}


def report_ip(snap: Snapshot, text: str, now: float) -> dict[str, Any]:
    ip = ipaddress.ip_address(text)
    matches = [
        ip_in_pool(snap, view.spec, ip, now)
        for _, view in sorted(snap.pools.items())
        if view.spec is not None and ip in view.spec.cidr
    ]
    listed = sorted(h.id for h in snap.handles.values() if any(i.ip == str(ip) for i in h.ips))
    return {
        "ip": str(ip),
        "revision": snap.revision,
        "matches": matches,
        "listedByHandles": listed,
    }


def handle_summary(handle: HandleView, snap: Snapshot) -> dict[str, Any]:
    ips = []
    for item in handle.ips:
        block = snap.blocks.get(item.block_key)
        ips.append(
            {
                "address": item.address,
                "gateway": item.gateway,
                "pool": item.pool,
                "block": item.block,
                "blockNode": block.affinity if block else None,
                "inBlock": bool(block and block.allocations.get(item.ip) == handle.id),
            }
        )
    network, container_id, ifname = (handle.id.split("/") + ["", ""])[:3]
    return {
        "handle": handle.id,
        "network": network,
        "containerID": container_id,
        "ifname": ifname,
        "node": handle.node or None,
        "ips": ips,
        "attributes": dict(handle.attributes),
        "createdAt": handle.created_at,
    }


def match_handles(snap: Snapshot, query: str) -> list[HandleView]:
    query = query.strip().strip("/")
    if query.startswith(HANDLES.lstrip("/")):
        query = query[len(HANDLES.lstrip("/")) :]
    parts = query.split("/")
    if len(parts) == 1:
        found = [h for h in snap.handles.values() if h.id.split("/")[1:2] == parts]
    else:
        found = [h for h in snap.handles.values() if h.id.split("/")[: len(parts)] == parts]
    return sorted(found, key=lambda h: h.id)


def report_handle(snap: Snapshot, query: str) -> dict[str, Any]:
    return {
        "query": query,
        "revision": snap.revision,
        "handles": [handle_summary(h, snap) for h in match_handles(snap, query)],
    }

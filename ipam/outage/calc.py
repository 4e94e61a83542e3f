"""The pure side of the outage guard: journal entries <-> records, which pools an ADD may be
served from without the store, and which journalled ADDs a later DEL cancels."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ipam.alloc.planner import netconf_pools
from ipam.alloc.selection import Selection
from ipam.records import HandleId, HandleRecord, LeasedIP

Names = tuple[tuple[str, ...], ...]  # candidate pool names per address to lease


def handle_dict(handle: HandleId) -> dict:
    return {"network": handle.network, "containerID": handle.container_id, "ifname": handle.ifname}


def entry_handle(entry: Mapping[str, Any]) -> HandleId:
    h = entry["handle"]
    return HandleId(str(h["network"]), str(h["containerID"]), str(h["ifname"]))


def entry_record(entry: Mapping[str, Any]) -> HandleRecord:
    handle = entry_handle(entry)
    return HandleRecord.from_bytes(handle.key, json.dumps(entry["record"]).encode())


def leased_ip(data: Mapping[str, Any]) -> LeasedIP:
    return LeasedIP(
        str(data["address"]), data.get("gateway"), str(data["pool"]), str(data["block"])
    )


def family_of(ips: list[LeasedIP]) -> int:
    return 6 if ips and ":" in ips[0].address else 4


def calc_pool_names(selection: Selection, buffers: Mapping[str, list[LeasedIP]]) -> Names:
    """Candidate pools per address without asking the store: a netconf range set's pools are
    derived from the netconf alone; named or selected cluster pools are grouped by the
    family of the addresses this node has buffered for them (IPv4 first)."""
    if selection.range_sets:
        return tuple(
            tuple(p.name for p in netconf_pools(selection.network, rs))
            for rs in selection.range_sets
        )
    names = selection.pools or tuple(sorted(buffers))
    by_family: dict[int, list[str]] = {}
    for name in names:
        if buffers.get(name):
            by_family.setdefault(family_of(buffers[name]), []).append(name)
    return tuple(tuple(by_family[f]) for f in sorted(by_family)) or ((),)


def calc_cancelled(batch: list[dict]) -> set[int]:
    """Seqs of ``add`` entries followed by a ``del`` of the same handle within ``batch``."""
    cancelled, deleted_after = set(), set()
    for entry in reversed(batch):
        key = entry_handle(entry).key
        if entry["op"] == "del":
            deleted_after.add(key)
        elif key in deleted_after:
            cancelled.add(entry["seq"])
    return cancelled

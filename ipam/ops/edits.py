"""Edits of stored block and handle records as JSON dicts (pure), keeping every field.

The operator tools (release, gc, pool rm --force) rewrite records the allocator wrote; they
work on the decoded JSON so a field they do not know (added by a newer pycnid) survives.
A freed address is stamped in the block's ``released`` map (reuse cooldown, issue 3) and a
block left without allocations gets ``emptySince``.
"""
from __future__ import annotations

import copy
import json
from typing import Any, Mapping

from ipam.store.base import KV


def encode(data: Mapping[str, Any]) -> bytes:
    """The same encoding as ``ipam.records.encode``."""
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


def decoded(kv: KV | None) -> tuple[int, dict | None]:
    """(mod_revision, JSON) of a key just read; (0, None) when absent. Corrupt values raise
    ValueError."""
    if kv is None:
        return 0, None
    data = json.loads(kv.value)
    if not isinstance(data, dict):
        raise ValueError(f"{kv.key} is not a JSON object")
    return kv.mod_revision, data


def block_without(block: Mapping[str, Any], ips: list[str], now: float) -> dict:
    out = copy.deepcopy(dict(block))
    allocations = dict(out.get("allocations") or {})
    released = dict(out.get("released") or {})
    borrowed = dict(out.get("borrowed") or {})
    for ip in ips:
        borrowed.pop(ip, None)
        if allocations.pop(ip, None) is not None:
            released[ip] = now
    out["allocations"], out["released"] = allocations, released
    set_or_drop(out, "borrowed", borrowed)
    if not allocations and not out.get("emptySince"):
        out["emptySince"] = now
    return out


def block_with(block: Mapping[str, Any], ip: str, holder: str, node: str = "") -> dict:
    """``ip`` allocated to ``holder``; marked borrowed when ``node`` is not the block's."""
    out = copy.deepcopy(dict(block))
    out["allocations"] = {**(out.get("allocations") or {}), ip: holder}
    released = dict(out.get("released") or {})
    released.pop(ip, None)
    set_or_drop(out, "released", released)
    borrowed = dict(out.get("borrowed") or {})
    borrowed.pop(ip, None)
    if node and node != out.get("affinity"):
        borrowed[ip] = node
    set_or_drop(out, "borrowed", borrowed)
    out.pop("emptySince", None)
    return out


def set_or_drop(record: dict, name: str, value: dict) -> None:
    """Like ``BlockRecord.to_bytes``: an empty map is left out."""
    if value:
        record[name] = value
    else:
        record.pop(name, None)


def affinity_record(pool: str, cidr: str, claimed_at: float) -> dict:
    """The value of /pycni/v1/affinity/<node>/<pool>/<block> (as ``ipam.alloc.plan`` writes it)."""
    return {"pool": pool, "cidr": cidr, "claimedAt": claimed_at}


def new_block(pool: str, cidr: str, node: str, now: float) -> dict:
    return {"pool": pool, "cidr": cidr, "affinity": node, "allocations": {}, "last": None,
            "claimedAt": now}


def handle_ips(handle: Mapping[str, Any]) -> list[str]:
    return [str(item.get("address", "")).split("/")[0] for item in handle.get("ips") or ()]


def handle_without(handle: Mapping[str, Any], ip: str, pool: str | None = None) -> dict:
    """The handle without ``ip`` (only the entry of ``pool`` when given)."""
    out = copy.deepcopy(dict(handle))
    out["ips"] = [item for item in out.get("ips") or ()
                  if not (str(item.get("address", "")).split("/")[0] == ip
                          and (pool is None or item.get("pool") == pool))]
    return out

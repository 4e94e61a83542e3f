"""`pycni ipam pool set`, pure: which settings may change and what the record becomes.

Mutable: disabled, nodeSelector, strictAffinity, exclusions, gateway, reuseDelay. Immutable:
cidr and blockSize (every block is cut by them): asking for another value is an error that
says what to do instead; repeating the current value is accepted. A netconf pool has no node
selector (its network's netconf selects it); the allocator honours the rest of its record.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ipam.alloc.pool_settings import (
    PoolInvalid,
    calc_exclusions,
    normalize_exclusion,
    parse_cidr,
    validate_gateway,
    validate_reuse_delay,
)
from ipam.alloc.pool_spec import spec_from_record, validate_usable
from ipam.ops.inspect import Snapshot
from ipam.records import IPNet


@dataclass(frozen=True)
class PoolUpdate:
    cidr: str | None = None
    block_size: int | None = None
    disabled: bool | None = None
    strict_affinity: bool | None = None
    node_selector: Mapping[str, str] | None = None  # replaces the selector ({}: all nodes)
    add_exclusions: tuple[str, ...] = ()
    remove_exclusions: tuple[str, ...] = ()
    clear_exclusions: bool = False
    gateway: str | None = None
    reuse_delay: float | None = None

    def needs_blocks(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
        """Whether the change must be checked against the pool's allocations."""
        grew = set(new.get("exclusions") or ()) - set(old.get("exclusions") or ())
        return bool(grew) or (new.get("gateway") == "first" != old.get("gateway"))

    def excluded_but_held(self, snap: Snapshot, name: str, new: Mapping[str, Any]) -> list[str]:
        spec = spec_from_record(new)
        held = sorted(
            (
                ip
                for b in snap.blocks_of(name)
                for ip in b.allocations
                if (spec.unallocatable_reason(ipaddress.ip_address(ip)) or "").startswith(
                    "excluded"
                )
            ),
            key=ipaddress.ip_address,
        )
        if not held:
            return []
        return [
            f"{len(held)} address(es) in the new exclusions stay held until released: "
            + ", ".join(held[:10])
            + (" ..." if len(held) > 10 else "")
        ]


def validate_immutable(spec_cidr: IPNet, spec_block: int, update: PoolUpdate, name: str) -> None:
    if update.cidr is not None and parse_cidr(update.cidr) != spec_cidr:
        raise PoolInvalid(
            f"cidr of pool {name} is immutable (it is {spec_cidr})",
            f"create a new pool, move the workloads, then pycni ipam pool rm {name}",
        )
    if update.block_size is not None and update.block_size != spec_block:
        raise PoolInvalid(
            f"blockSize of pool {name} is immutable (it is /{spec_block})",
            "blocks already claimed are cut by it; create a new pool instead",
        )


def calc_updated_record(old: Mapping[str, Any], update: PoolUpdate) -> dict:
    """The record after ``update``, validated (PoolInvalid naming the setting)."""
    spec = spec_from_record(old)
    validate_immutable(spec.cidr, spec.block_size, update, spec.name)
    if spec.network is not None and update.node_selector is not None:
        raise PoolInvalid(
            f"pool {spec.name} comes from the ranges of network {spec.network}",
            "its netconf selects it, a node selector does not apply",
        )
    new = dict(old)
    if update.disabled is not None:
        new["disabled"] = update.disabled
    if update.strict_affinity is not None:
        new["strictAffinity"] = update.strict_affinity
    if update.node_selector is not None:
        new["nodeSelector"] = dict(update.node_selector)
    if update.gateway is not None:
        new["gateway"] = validate_gateway(update.gateway)
    if update.reuse_delay is not None:
        new["reuseDelay"] = validate_reuse_delay(update.reuse_delay)
    if update.add_exclusions or update.remove_exclusions or update.clear_exclusions:
        new["exclusions"] = calc_new_exclusions(list(spec.exclusions), update, spec.cidr)
    validate_usable(spec_from_record(new))
    return new


def calc_new_exclusions(current: list[str], update: PoolUpdate, cidr: IPNet) -> list[str]:
    out = [] if update.clear_exclusions else current
    for item in update.remove_exclusions:
        text = normalize_exclusion(item, cidr)
        if text not in out:
            raise PoolInvalid(
                f"exclusion {item} is not set",
                f"the exclusions are: {', '.join(current) or 'none'}",
            )
        out = [e for e in out if e != text]
    return list(calc_exclusions([*out, *update.add_exclusions], cidr))


def find_gateway_conflicts(snap: Snapshot, name: str, new: Mapping[str, Any]) -> list[str]:
    """With gateway "first": the block gateways that a handle holds already."""
    spec = spec_from_record(new)
    if spec.gateway != "first":
        return []
    out = []
    for block in snap.blocks_of(name):
        gateway = spec.block_gateway(block.net)
        if gateway is not None and str(gateway) in block.allocations:
            out.append(f"{gateway} ({block.allocations[str(gateway)]})")
    return out

"""Pools as records, pure: validation, and which addresses of a pool can ever be handed out.

A pool record (``/pycni/v1/pools/<name>``, docs/store-layout.md "Pools") is either a *cluster pool*
made by ``pycni ipam pool add`` — ``{name, cidr, blockSize, disabled, nodeSelector {label: value},
strictAffinity, exclusions [cidr | "a-b"], gateway "none"|"first", reuseDelay, createdAt}`` — or a
*netconf pool* the allocator derives from a network's ``ranges`` (``"source": "netconf"``,
``network``, ``ranges [{rangeStart, rangeEnd, gateway}]``).

What is never handed out (the one definition every report counts with): addresses outside
the netconf ranges, a netconf range's gateway, the IPv4 network and broadcast addresses of the
pool's CIDR, the exclusions, and with ``gateway: "first"`` each block's gateway: the lowest
address of the block that is not otherwise excluded. ``PoolSpec.block_capacity`` and
``PoolSpec.size`` count with it; integers throughout, so IPv6 /64 pools are exact and cheap.
Each setting is validated in ``ipam.alloc.pool_settings``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ipam.alloc.intervals import Interval, count, fully_covered_blocks, intersect, merge, subtract
from ipam.alloc.pool_settings import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_REUSE_DELAY,
    calc_block_size,
    calc_exclusions,
    invalid,
    parse_cidr,
    parse_exclusion,
    validate_gateway,
    validate_name,
    validate_reuse_delay,
)

IPNet = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class PoolSpec:
    """A pool record, parsed."""

    name: str
    cidr: IPNet
    block_size: int
    disabled: bool = False
    node_selector: Mapping[str, str] = field(default_factory=dict)
    strict_affinity: bool = False
    exclusions: tuple[str, ...] = ()
    gateway: str = "none"
    reuse_delay: float = DEFAULT_REUSE_DELAY
    created_at: float = 0.0
    network: str | None = None  # netconf pools: the network they serve
    ranges: tuple[tuple[int, int, int | None], ...] = ()  # netconf pools: (start, end, gateway)

    @property
    def source(self) -> str:
        return "netconf" if self.network is not None else "cluster"

    @property
    def family(self) -> int:
        return self.cidr.version

    @cached_property
    def bounds(self) -> Interval:
        return int(self.cidr.network_address), int(self.cidr.broadcast_address)

    @cached_property
    def excluded(self) -> list[Interval]:
        """Merged intervals of the pool never handed out (block gateways aside)."""
        out = [parse_exclusion(text, self.cidr) for text in self.exclusions]
        out += [(gw, gw) for _, _, gw in self.ranges if gw is not None]
        if self.family == 4:
            out += [(self.bounds[0], self.bounds[0]), (self.bounds[1], self.bounds[1])]
        return merge(out)

    @cached_property
    def allowed(self) -> list[Interval]:
        if not self.ranges:
            return [self.bounds]
        return merge((start, end) for start, end, _ in self.ranges)

    def usable(self, lo: int, hi: int) -> list[Interval]:
        """The addresses of [lo, hi] that are handed out, block gateways not yet removed."""
        return subtract(intersect(self.allowed, (lo, hi)), self.excluded)

    def block_gateway(self, block: IPNet) -> IPAddr | None:
        """With gateway "first": the block's lowest usable address."""
        if self.gateway != "first":
            return None
        usable = self.usable(int(block.network_address), int(block.broadcast_address))
        return ipaddress.ip_address(usable[0][0]) if usable else None

    def block_capacity(self, block: IPNet) -> int:
        """How many addresses of ``block`` can ever be handed out."""
        usable = count(self.usable(int(block.network_address), int(block.broadcast_address)))
        return usable - 1 if usable and self.gateway == "first" else usable

    @cached_property
    def size(self) -> int:
        """How many addresses of the whole pool can ever be handed out."""
        usable = count(self.usable(*self.bounds))
        if self.gateway != "first":
            return usable
        blocks = 1 << (self.block_size - self.cidr.prefixlen)
        unusable = subtract([self.bounds], self.usable(*self.bounds))
        return usable - (
            blocks - fully_covered_blocks(unusable, self.block_size, self.cidr.max_prefixlen)
        )

    @property
    def reserved(self) -> int:
        return self.cidr.num_addresses - self.size

    def unallocatable_reason(self, ip: IPAddr) -> str | None:
        """Why ``ip`` (inside the CIDR) is never handed out; None when it can be."""
        value = int(ip)
        if not any(lo <= value <= hi for lo, hi in self.allowed):
            return "outside the pool's ranges"
        if self.family == 4 and value in self.bounds:
            return "the pool's network or broadcast address"
        for text in self.exclusions:
            lo, hi = parse_exclusion(text, self.cidr)
            if lo <= value <= hi:
                return f"excluded ({text})"
        if any(gw == value for _, _, gw in self.ranges):
            return "the gateway of its range"
        if ip == self.block_gateway(self.block_of(ip)):
            return f"the gateway of block {self.block_of(ip)}"
        return None

    def block_of(self, ip: IPAddr) -> IPNet:
        return ipaddress.ip_network(f"{ip}/{self.block_size}", strict=False)


def make_pool(
    name: str,
    cidr: str,
    *,
    block_size: int | None = None,
    node_selector: Mapping[str, str] | None = None,
    disabled: bool = False,
    strict_affinity: bool = False,
    exclusions: Iterable[str] = (),
    gateway: str = "none",
    reuse_delay: float = DEFAULT_REUSE_DELAY,
    created_at: float = 0.0,
) -> PoolSpec:
    """A new cluster pool, every setting validated (PoolInvalid naming the bad one)."""
    net = parse_cidr(cidr)
    spec = PoolSpec(
        name=validate_name(name),
        cidr=net,
        block_size=calc_block_size(net, block_size),
        disabled=bool(disabled),
        node_selector=dict(node_selector or {}),
        strict_affinity=bool(strict_affinity),
        exclusions=calc_exclusions(exclusions, net),
        gateway=validate_gateway(gateway),
        reuse_delay=validate_reuse_delay(reuse_delay),
        created_at=created_at,
    )
    return validate_usable(spec)


def validate_usable(spec: PoolSpec) -> PoolSpec:
    if spec.size == 0:
        raise invalid(
            f"pool {spec.name}",
            f"no address of {spec.cidr} could ever be handed "
            "out (exclusions, gateways, network/broadcast)",
        )
    return spec


def record_of(spec: PoolSpec) -> dict[str, Any]:
    """The cluster pool record as stored (what ``pycni ipam pool add`` writes)."""
    return {
        "name": spec.name,
        "cidr": str(spec.cidr),
        "blockSize": spec.block_size,
        "disabled": spec.disabled,
        "nodeSelector": dict(spec.node_selector),
        "strictAffinity": spec.strict_affinity,
        "exclusions": list(spec.exclusions),
        "gateway": spec.gateway,
        "reuseDelay": spec.reuse_delay,
        "createdAt": spec.created_at,
    }


def spec_from_record(record: Mapping[str, Any]) -> PoolSpec:
    """A stored pool record (cluster or netconf) parsed; PoolInvalid when it is unusable."""
    name = str(record.get("name", "?"))
    net = parse_cidr(record.get("cidr"), f"pool {name} cidr")
    size = record.get("blockSize", max(DEFAULT_BLOCK_SIZE[net.version], net.prefixlen))
    if (
        isinstance(size, bool)
        or not isinstance(size, int)
        or not net.prefixlen <= size <= net.max_prefixlen
    ):
        raise invalid(f"pool {name} blockSize", f"{size!r} does not fit {net}")
    selector = record.get("nodeSelector")
    delay = record.get("reuseDelay", DEFAULT_REUSE_DELAY)
    return PoolSpec(
        name=name,
        cidr=net,
        block_size=size,
        disabled=bool(record.get("disabled", False)),
        node_selector={str(k): str(v) for k, v in selector.items()}
        if isinstance(selector, dict)
        else {},
        strict_affinity=bool(record.get("strictAffinity", record.get("source") == "netconf")),
        exclusions=calc_exclusions(record.get("exclusions") or (), net),
        gateway=str(record.get("gateway") or "none"),
        reuse_delay=delay if isinstance(delay, (int, float)) else DEFAULT_REUSE_DELAY,
        created_at=float(record.get("createdAt") or 0),
        network=str(record["network"]) if record.get("source") == "netconf" else None,
        ranges=parse_netconf_ranges(record.get("ranges"), net, name),
    )


def parse_netconf_ranges(
    value: Any, cidr: IPNet, name: str
) -> tuple[tuple[int, int, int | None], ...]:
    out = []
    for item in value or ():
        try:
            start = int(ipaddress.ip_address(item["rangeStart"]))
            end = int(ipaddress.ip_address(item["rangeEnd"]))
            gateway = item.get("gateway")
            out.append((start, end, int(ipaddress.ip_address(gateway)) if gateway else None))
        except (KeyError, TypeError, ValueError) as exc:
            raise invalid(f"pool {name} ranges", f"{item!r}: {exc}") from None
    return tuple(out)


def render_selector(selector: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or "all()"

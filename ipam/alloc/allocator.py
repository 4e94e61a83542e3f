"""Allocation mechanics, pure (no I/O): pools, blocks, and which address of a block is next.

A ``Pool`` is a parsed pool record (``ipam.alloc.pool_spec.PoolSpec``: the one definition of which
addresses are never handed out, shared with the reports) plus the allocator's per-block view
of it. Pools come from two places:

- *netconf pools*: one per distinct subnet of a netconf range set (host-local style ranges,
  named ``<network>-<subnet>``); addresses outside every rangeStart..rangeEnd, a range's gateway
  and the IPv4 network/broadcast addresses are never handed out; blocks are claimed lowest
  first, and a node never borrows from another node's block (``strictAffinity`` unless the
  stored record says otherwise).
- *cluster pools*: records made by ``pycni ipam pool add``; exclusions, ``gateway: "first"``
  (each block's lowest usable address is its gateway), ``strictAffinity``, ``reuseDelay``;
  blocks are claimed in an order seeded by a hash of the node name, so nodes diverge.

Within a block the next address is the first free one after the last handed out (round robin,
like host-local). Integers are Python ints: IPv6 arithmetic is exact over all 128 bits.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from cni.spec.errors import CNIError, InternalError
from ipam.alloc.intervals import Interval, count
from ipam.alloc.pool_spec import DEFAULT_BLOCK_SIZE, PoolSpec, calc_exclusions, spec_from_record
from ipam.records import IPNet
from store.keys import cidr_key

IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address
SEGMENT_CACHE_LIMIT = 4096


@dataclass(frozen=True)
class Range:
    subnet: IPNet
    start: IPAddr
    end: IPAddr
    gateway: IPAddr
    block_prefix: int | None = None  # requested block size; None = the family default
    where: str = ""  # the config key, for messages: "ipam.ranges[0][1]"

    def contains(self, ip: IPAddr) -> bool:
        # start and end are of the subnet's family (plugins.ipam.ranges), so as integers they
        # order exactly as the addresses do
        return ip.version == self.start.version and int(self.start) <= int(ip) <= int(self.end)

    def describe(self) -> str:
        return f"{self.subnet} ({self.start}-{self.end})"


@dataclass(eq=False)
class Pool:
    """A pool as the allocator uses it (identity equality: it caches per-block segments)."""

    spec: PoolSpec
    strict_affinity: bool
    ranges: tuple[Range, ...] = ()  # netconf pools: the ranges, for messages
    _segments: dict[str, tuple[Interval, ...]] = field(default_factory=dict, repr=False)
    _capacity: dict[str, int] = field(default_factory=dict, repr=False)

    name = property(lambda self: self.spec.name)
    cidr = property(lambda self: self.spec.cidr)
    block_prefix = property(lambda self: self.spec.block_size)
    disabled = property(lambda self: self.spec.disabled)
    reuse_delay = property(lambda self: float(self.spec.reuse_delay))
    source = property(lambda self: self.spec.source)
    family = property(lambda self: self.spec.cidr.version)

    def describe(self) -> str:
        if self.ranges:
            return ", ".join(r.describe() for r in self.ranges)
        return f"{self.name} ({self.cidr})"

    def segments(self, block: IPNet | str) -> tuple[Interval, ...]:
        """The addresses of ``block`` that can be handed out, as intervals (cached)."""
        key = block if isinstance(block, str) else str(block)
        found = self._segments.get(key)
        if found is None:
            found = tuple(calc_segments(self.spec, parse_cidr(key)))
            if len(self._segments) >= SEGMENT_CACHE_LIMIT:
                self._segments.clear()
                self._capacity.clear()
            self._segments[key] = found
        return found

    def capacity(self, block: IPNet | str) -> int:
        key = block if isinstance(block, str) else str(block)
        found = self._capacity.get(key)
        if found is None:
            found = self._capacity[key] = count(self.segments(key))
        return found

    def block_of(self, ip: IPAddr) -> IPNet:
        return parse_cidr(f"{ip}/{self.block_prefix}", strict=False)

    def allocatable(self, ip: IPAddr) -> bool:
        if ip.version != self.family or ip not in self.cidr:
            return False
        value = int(ip)
        return any(lo <= value <= hi for lo, hi in self.segments(self.block_of(ip)))

    def gateway_for(self, ip: IPAddr) -> IPAddr | None:
        """The gateway returned with ``ip``: its block's (gateway "first") or its range's."""
        if self.spec.gateway == "first":
            return self.spec.block_gateway(self.block_of(ip))
        value = int(ip)
        return next(
            (
                ipaddress.ip_address(gw)
                for lo, hi, gw in self.spec.ranges
                if lo <= value <= hi and gw is not None
            ),
            None,
        )


def calc_segments(spec: PoolSpec, block: IPNet) -> list[Interval]:
    usable = spec.usable(int(block.network_address), int(block.broadcast_address))
    if spec.gateway == "first" and usable:
        lo, hi = usable[0]
        usable = ([(lo + 1, hi)] if lo < hi else []) + usable[1:]
    return usable


def is_reserved_v4(subnet: IPNet, ip: IPAddr) -> bool:
    """The IPv4 network and broadcast addresses of ``subnet``."""
    return subnet.version == 4 and ip in (subnet.network_address, subnet.broadcast_address)


def calc_pool_name(network: str, subnet: IPNet) -> str:
    return f"{network}-{cidr_key(subnet)}"


def calc_block_prefix(subnet: IPNet, requested: int | None = None) -> int:
    """The block prefix length: the requested or default one, never wider than the subnet."""
    prefix = requested if requested is not None else DEFAULT_BLOCK_SIZE[subnet.version]
    return min(max(prefix, subnet.prefixlen), subnet.max_prefixlen)


def calc_pools(network: str, range_set: tuple[Range, ...]) -> tuple[Pool, ...]:
    """One netconf pool per distinct subnet of a range set, in config order."""
    by_subnet: dict[IPNet, list[Range]] = {}
    for rng in range_set:
        by_subnet.setdefault(rng.subnet, []).append(rng)
    return tuple(
        netconf_pool(network, subnet, tuple(ranges)) for subnet, ranges in by_subnet.items()
    )


def netconf_pool(network: str, subnet: IPNet, ranges: tuple[Range, ...]) -> Pool:
    spec = PoolSpec(
        name=calc_pool_name(network, subnet),
        cidr=subnet,
        block_size=calc_block_prefix(subnet, ranges[0].block_prefix),
        strict_affinity=True,
        network=network,
        ranges=tuple((int(r.start), int(r.end), int(r.gateway)) for r in ranges),
    )
    return Pool(spec, strict_affinity=True, ranges=ranges)


def pool_record(pool: Pool, network: str) -> dict:
    """A netconf pool as stored under /pycni/v1/pools/<pool> (derived from the netconf)."""
    return {
        "name": pool.name,
        "network": network,
        "cidr": str(pool.cidr),
        "blockSize": pool.block_prefix,
        "disabled": False,
        "nodeSelector": "all()",
        "strictAffinity": True,
        "source": "netconf",
        "ranges": range_limits(pool),
    }


def range_limits(pool: Pool) -> list[dict]:
    return [
        {"rangeStart": str(r.start), "rangeEnd": str(r.end), "gateway": str(r.gateway)}
        for r in pool.ranges
    ]


def merge_pool_record(pool: Pool, network: str, stored: Mapping | None) -> dict:
    """What a netconf pool's record should be: the stored one (its block size and flags win,
    its other fields are kept) with the netconf's range limits."""
    if stored is None:
        return pool_record(pool, network)
    return {**stored, "ranges": range_limits(pool)}


def apply_pool_record(pool: Pool, record: Mapping) -> Pool:
    """A netconf pool as its stored record says: block size (fixed once blocks exist),
    ``disabled``, and whatever the operator set (exclusions, gateway, strictAffinity,
    reuseDelay)."""
    spec = pool.spec
    prefix = record.get("blockSize", spec.block_size)
    if (
        isinstance(prefix, bool)
        or not isinstance(prefix, int)
        or not spec.cidr.prefixlen <= prefix <= spec.cidr.max_prefixlen
    ):
        prefix = spec.block_size
    changes: dict[str, Any] = {
        "block_size": prefix,
        "disabled": bool(record.get("disabled", False)),
    }
    try:
        if record.get("exclusions"):
            changes["exclusions"] = calc_exclusions(record["exclusions"], spec.cidr)
    except CNIError as err:
        raise InternalError(f"corrupt IPAM pool record {pool.name}", str(err)) from None
    if record.get("gateway") in ("none", "first"):
        changes["gateway"] = record["gateway"]
    if isinstance(record.get("reuseDelay"), (int, float)):
        changes["reuse_delay"] = record["reuseDelay"]
    strict = bool(record.get("strictAffinity", True))
    return Pool(replace(spec, strict_affinity=strict, **changes), strict, pool.ranges)


def pool_from_record(record: Mapping) -> Pool:
    """A cluster pool from its stored record; InternalError naming it when unusable."""
    try:
        spec = spec_from_record(record)
    except CNIError as err:
        raise InternalError(
            f"unusable IPAM pool record {record.get('name')!r}", str(err)
        ) from None
    if spec.gateway not in ("none", "first"):
        spec = replace(spec, gateway="none")
    return Pool(spec, strict_affinity=spec.strict_affinity)


def block_containing(pool: Pool, ip: IPAddr) -> IPNet:
    return pool.block_of(ip)


def find_pool(pools: tuple[Pool, ...], ip: IPAddr) -> Pool | None:
    """The pool in which ``ip`` can be handed out (gateways, exclusions, reserved excluded)."""
    return next((p for p in pools if p.allocatable(ip)), None)


def _round_robin(segments: tuple[Interval, ...], start: int) -> Iterator[int]:
    """Every integer of the segments, from ``start`` upwards, then wrapping to the lowest."""
    for a, b in segments:
        yield from range(max(a, start), b + 1)
    for a, b in segments:
        yield from range(a, min(b, start - 1) + 1)


def block_capacity(pool: Pool, block: IPNet) -> int:
    """How many addresses of ``block`` can ever be handed out."""
    return pool.capacity(block)


def pick_address(
    pool: Pool,
    block: IPNet | str,
    allocations: Collection[str] = (),
    last: str | None = None,
    avoid: Collection[str] = (),
) -> IPAddr | None:
    """The next free address of ``block`` after ``last`` (wrapping), skipping ``avoid``
    (addresses in their reuse delay); None when there is none."""
    if allocations and len(allocations) >= pool.capacity(block):
        return None
    start = 0
    if last:
        last_ip = ipaddress.ip_address(last)
        if last_ip in parse_cidr(block if isinstance(block, str) else str(block)):
            start = int(last_ip) + 1
    make = ipaddress.IPv4Address if pool.family == 4 else ipaddress.IPv6Address
    for value in _round_robin(pool.segments(block), start):
        text = str(make(value))
        if text not in allocations and text not in avoid:
            return make(value)
    return None


@lru_cache(maxsize=65536)
def parse_cidr(cidr: str, strict: bool = True) -> IPNet:
    return ipaddress.ip_network(cidr, strict=strict)


@lru_cache(maxsize=65536)
def cidr_order(cidr: str) -> tuple[int, int, int]:
    """Sort key of a block CIDR string: family, then address."""
    net = parse_cidr(cidr)
    return net.version, int(net.network_address), net.prefixlen


def calc_seed(node: str, pool: str) -> int:
    """A stable per-(node, pool) number: where a node starts looking for free blocks."""
    return int.from_bytes(hashlib.sha256(f"{node}\0{pool}".encode()).digest()[:16], "big")


def iter_candidate_blocks(
    pool: Pool, taken: Collection[str], seed: int | None = None
) -> Iterator[IPNet]:
    """Unclaimed blocks (CIDR string not in ``taken``) with an address to hand out. Netconf
    pools (or no seed): lowest first; else a permutation of every block seeded by ``seed``.
    Lazy: an IPv6 /64 has 2**58 blocks."""
    order = _ascending_blocks(pool) if seed is None or pool.ranges else _seeded_blocks(pool, seed)
    for block in order:
        if str(block) not in taken and pool.capacity(block) > 0:
            yield block


def _ascending_blocks(pool: Pool) -> Iterator[IPNet]:
    step = 1 << (pool.cidr.max_prefixlen - pool.block_prefix)
    last = -1
    for lo, hi in pool.spec.allowed:
        for base in range(max(lo - lo % step, last + 1), hi + 1, step):
            last = base
            yield _block_at(pool, base)


def _seeded_blocks(pool: Pool, seed: int) -> Iterator[IPNet]:
    """i -> (a*i + c) mod n with odd a is a permutation of the n = 2**k blocks."""
    bits = pool.block_prefix - pool.cidr.prefixlen
    n = 1 << bits
    a, c = (seed | 1) % n or 1, (seed >> 64) % n
    step = 1 << (pool.cidr.max_prefixlen - pool.block_prefix)
    base = int(pool.cidr.network_address)
    for i in range(n):
        yield _block_at(pool, base + ((a * i + c) % n) * step)


def _block_at(pool: Pool, base: int) -> IPNet:
    make = ipaddress.IPv4Network if pool.family == 4 else ipaddress.IPv6Network
    return make((base, pool.block_prefix))

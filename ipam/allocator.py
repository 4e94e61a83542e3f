"""Allocation policy, pure (no I/O): pools, blocks, and which address to hand out next.

A *range* is one host-local style entry (subnet, rangeStart..rangeEnd, gateway). Ranges of one
network over the same subnet form a *pool*, cut into *blocks* (default /26 for IPv4, /122 for
IPv6, never larger than the subnet) that a node claims and then allocates from. Never handed
out: a range's gateway, the IPv4 network and broadcast addresses, anything outside every
rangeStart..rangeEnd. Within a block the next address is the first free one after the last
handed out (round robin, like host-local), so a released address is not reused at once.
Integers are Python ints: IPv6 arithmetic is exact over all 128 bits.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import Collection, Iterator, Mapping

from ipam.records import BlockRecord, IPNet, cidr_key

IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address
DEFAULT_BLOCK_PREFIX = {4: 26, 6: 122}


@dataclass(frozen=True)
class Range:
    subnet: IPNet
    start: IPAddr
    end: IPAddr
    gateway: IPAddr
    block_prefix: int | None = None  # requested block size; None = the family default
    where: str = ""  # the config key, for messages: "ipam.ranges[0][1]"

    def contains(self, ip: IPAddr) -> bool:
        return ip.version == self.start.version and self.start <= ip <= self.end

    def describe(self) -> str:
        return f"{self.subnet} ({self.start}-{self.end})"


@dataclass(frozen=True)
class Pool:
    """The ranges of one network over one subnet, as blocks."""

    name: str
    cidr: IPNet
    block_prefix: int
    ranges: tuple[Range, ...]
    disabled: bool = False

    @cached_property
    def gateways(self) -> frozenset[IPAddr]:
        return frozenset(r.gateway for r in self.ranges)

    def describe(self) -> str:
        return ", ".join(r.describe() for r in self.ranges)

    def allocatable(self, ip: IPAddr) -> bool:
        return (any(r.contains(ip) for r in self.ranges) and ip not in self.gateways
                and not is_reserved_v4(self.cidr, ip))

    def gateway_for(self, ip: IPAddr) -> IPAddr | None:
        return next((r.gateway for r in self.ranges if r.contains(ip)), None)


def is_reserved_v4(subnet: IPNet, ip: IPAddr) -> bool:
    """The IPv4 network and broadcast addresses of ``subnet``."""
    return subnet.version == 4 and ip in (subnet.network_address, subnet.broadcast_address)


def calc_pool_name(network: str, subnet: IPNet) -> str:
    return f"{network}-{cidr_key(subnet)}"


def calc_block_prefix(subnet: IPNet, requested: int | None = None) -> int:
    """The block prefix length: the requested or default one, never wider than the subnet."""
    prefix = requested if requested is not None else DEFAULT_BLOCK_PREFIX[subnet.version]
    return min(max(prefix, subnet.prefixlen), subnet.max_prefixlen)


def calc_pools(network: str, range_set: tuple[Range, ...]) -> tuple[Pool, ...]:
    """One pool per distinct subnet of a range set, in config order."""
    by_subnet: dict[IPNet, list[Range]] = {}
    for rng in range_set:
        by_subnet.setdefault(rng.subnet, []).append(rng)
    return tuple(Pool(calc_pool_name(network, subnet),
                      subnet, calc_block_prefix(subnet, ranges[0].block_prefix), tuple(ranges))
                 for subnet, ranges in by_subnet.items())


def pool_record(pool: Pool, network: str) -> dict:
    """The pool as stored under /pycni/v1/pools/<pool> (derived from the netconf)."""
    return {"name": pool.name, "network": network, "cidr": str(pool.cidr),
            "blockSize": pool.block_prefix, "disabled": pool.disabled, "nodeSelector": "all()",
            "source": "netconf", "ranges": range_limits(pool)}


def range_limits(pool: Pool) -> list[dict]:
    return [{"rangeStart": str(r.start), "rangeEnd": str(r.end), "gateway": str(r.gateway)}
            for r in pool.ranges]


def merge_pool_record(pool: Pool, network: str, stored: Mapping | None) -> dict:
    """What the pool record should be: the stored one (its block size and flags win, its
    other fields are kept) with the netconf's range limits."""
    if stored is None:
        return pool_record(pool, network)
    return {**stored, "ranges": range_limits(pool)}


def apply_pool_record(pool: Pool, record: Mapping) -> Pool:
    """The pool as the store says: block size is fixed once blocks exist; `disabled` is honoured."""
    prefix = record.get("blockSize", pool.block_prefix)
    if not isinstance(prefix, int) or not pool.cidr.prefixlen <= prefix <= pool.cidr.max_prefixlen:
        prefix = pool.block_prefix
    return replace(pool, block_prefix=prefix, disabled=bool(record.get("disabled", False)))


def block_containing(pool: Pool, ip: IPAddr) -> IPNet:
    return ipaddress.ip_network(f"{ip}/{pool.block_prefix}", strict=False)


def find_pool(pools: tuple[Pool, ...], ip: IPAddr) -> Pool | None:
    """The pool whose ranges allow ``ip`` (gateway and reserved addresses excluded)."""
    return next((p for p in pools if p.allocatable(ip)), None)


def _segments(pool: Pool, block: IPNet) -> list[tuple[int, int]]:
    """Inclusive integer intervals of ``block`` inside the pool's ranges, ascending."""
    lo, hi = int(block.network_address), int(block.broadcast_address)
    out = [(max(lo, int(r.start)), min(hi, int(r.end))) for r in pool.ranges]
    return sorted((a, b) for a, b in out if a <= b)


def _round_robin(segments: list[tuple[int, int]], start: int) -> Iterator[int]:
    """Every integer of the segments, from ``start`` upwards, then wrapping to the lowest."""
    for a, b in segments:
        yield from range(max(a, start), b + 1)
    for a, b in segments:
        yield from range(a, min(b, start - 1) + 1)


@lru_cache(maxsize=4096)
def block_capacity(pool: Pool, block: IPNet) -> int:
    """How many addresses of ``block`` can ever be handed out."""
    segments = _segments(pool, block)
    size = sum(b - a + 1 for a, b in segments)
    excluded = set(pool.gateways)
    if pool.cidr.version == 4:
        excluded |= {pool.cidr.network_address, pool.cidr.broadcast_address}
    return size - sum(1 for ip in excluded if any(a <= int(ip) <= b for a, b in segments))


def pick_address(pool: Pool, block: IPNet, allocations: Collection[str] = (),
                 last: str | None = None) -> IPAddr | None:
    """The next free allocatable address of ``block`` after ``last`` (wrapping), or None."""
    if allocations and len(allocations) >= block_capacity(pool, block):
        return None
    start = 0
    if last:
        last_ip = ipaddress.ip_address(last)
        if last_ip in block:
            start = int(last_ip) + 1
    make = ipaddress.IPv4Address if pool.cidr.version == 4 else ipaddress.IPv6Address
    for value in _round_robin(_segments(pool, block), start):
        ip = make(value)
        if pool.allocatable(ip) and str(ip) not in allocations:
            return ip
    return None


@lru_cache(maxsize=65536)
def parse_cidr(cidr: str) -> IPNet:
    return ipaddress.ip_network(cidr)


def iter_candidate_blocks(pool: Pool, taken: Collection[str]) -> Iterator[IPNet]:
    """Unclaimed blocks (by CIDR string not in ``taken``) holding an allocatable address,
    lowest first. Lazy: an IPv6 /64 has 2**58 blocks."""
    step = 1 << (pool.cidr.max_prefixlen - pool.block_prefix)
    make = ipaddress.IPv4Network if pool.cidr.version == 4 else ipaddress.IPv6Network
    seen: set[int] = set()
    for rng in sorted(pool.ranges, key=lambda r: r.start):
        first = int(block_containing(pool, rng.start).network_address)
        for base in range(first, int(rng.end) + 1, step):
            if base in seen:
                continue
            seen.add(base)
            block = make((base, pool.block_prefix))
            if str(block) not in taken and pick_address(pool, block) is not None:
                yield block


@dataclass(frozen=True)
class Choice:
    """Where one address comes from: an existing block of this node, or a block to claim."""

    pool: Pool
    block: IPNet
    address: IPAddr
    claim: bool


def choose_address(pools: tuple[Pool, ...], own: Mapping[str, Mapping[str, BlockRecord]],
                   taken: Mapping[str, Collection[str]]) -> Choice | None:
    """Policy for one range set: first the node's own blocks (pool order, then block order),
    then the first unclaimed block; None when the node can get no address from any pool.

    ``own[pool][cidr]`` are this node's blocks; ``taken[pool]`` every claimed block's CIDR.
    """
    for pool in pools:
        if pool.disabled:
            continue
        for cidr, block in sorted(own.get(pool.name, {}).items(),
                                  key=lambda item: parse_cidr(item[0])):
            net = parse_cidr(cidr)
            ip = pick_address(pool, net, block.allocations, block.last)
            if ip is not None:
                return Choice(pool, net, ip, claim=False)
    for pool in pools:
        if pool.disabled:
            continue
        block = next(iter_candidate_blocks(pool, taken.get(pool.name, ())), None)
        if block is not None:
            return Choice(pool, block, pick_address(pool, block), claim=True)
    return None


def locate_requested(range_sets: tuple[tuple[Pool, ...], ...],
                     ip: IPAddr) -> tuple[int, Pool] | None:
    """The range set index and pool a requested address belongs to."""
    for index, pools in enumerate(range_sets):
        pool = find_pool(pools, ip)
        if pool is not None:
            return index, pool
    return None

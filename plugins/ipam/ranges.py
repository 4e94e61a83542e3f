"""pycni-ipam's address ranges: ``ipam.ranges``, the ``ipam.subnet`` shorthand and the
``ipRanges`` capability, parsed into range sets (``ipam.alloc.allocator.Range``).

A range set is a non-empty list of ranges of one IP family; one address is leased per set.
Range sets must not share addresses. Every problem is InvalidConfig (code 7) naming the key.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from cni.spec.errors import InvalidConfig
from ipam.alloc.allocator import IPAddr, Range, is_reserved_v4
from ipam.records import IPNet


def invalid(key: str, details: str) -> InvalidConfig:
    return InvalidConfig(f"invalid {key}", details)


def parse_range_sets(ipam: Mapping, runtime: Any) -> tuple[tuple[Range, ...], ...]:
    if isinstance(runtime, dict) and runtime.get("ipRanges"):
        sets = _parse_sets(runtime["ipRanges"], "runtimeConfig.ipRanges")
    else:
        sets = _parse_sets(ipam.get("ranges", []), "ipam.ranges")
        if ipam.get("subnet") is not None:
            sets = ((parse_range(ipam, "ipam"),),) + sets
    if not sets:
        raise InvalidConfig(
            "invalid ipam config: no address range",
            "set ipam.ranges (a list of range sets) or ipam.subnet",
        )
    validate_no_overlap(sets)
    return sets


def _parse_sets(value: Any, key: str) -> tuple[tuple[Range, ...], ...]:
    if not isinstance(value, list):
        raise invalid(key, "expected a list of range sets (each a list of ranges)")
    sets = []
    for i, items in enumerate(value):
        if not isinstance(items, list) or not items:
            raise invalid(f"{key}[{i}]", "a range set is a non-empty list of ranges")
        ranges = tuple(parse_range(item, f"{key}[{i}][{j}]") for j, item in enumerate(items))
        for rng in ranges[1:]:
            if rng.subnet.version != ranges[0].subnet.version:
                raise invalid(rng.where, f"range set {key}[{i}] mixes IPv4 and IPv6")
        sets.append(ranges)
    return tuple(sets)


def parse_subnet(value: Any, key: str) -> IPNet:
    if not isinstance(value, str) or "/" not in value:
        raise invalid(key, f"expected a CIDR string like 10.22.0.0/16, got {value!r}")
    try:
        iface = ipaddress.ip_interface(value)
    except ValueError as exc:
        raise invalid(key, f"{value!r} is not a CIDR: {exc}") from None
    subnet = iface.network
    if iface.ip != subnet.network_address:
        raise invalid(key, f"{value!r} has host bits set; the network is {subnet}")
    if subnet.prefixlen > subnet.max_prefixlen - 2:
        raise invalid(key, f"network {subnet} is too small to allocate from")
    return subnet


def parse_ip(value: Any, key: str, subnet: IPNet | None = None) -> IPAddr:
    if not isinstance(value, str):  # ip_address(5) would be 0.0.0.5
        raise invalid(key, f"expected an IP address string, got {value!r}")
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        raise invalid(key, f"{value!r} is not an IP address") from None
    if subnet is not None and ip.version != subnet.version:
        raise invalid(key, f"{ip} is not of the same IP family as {subnet}")
    return ip


def parse_range(item: Any, where: str) -> Range:
    if not isinstance(item, dict):
        raise invalid(where, "expected an object with 'subnet'")
    subnet = parse_subnet(item.get("subnet"), f"{where}.subnet")
    start, end = _range_limits(item, where, subnet)
    gateway = (
        parse_gateway(item["gateway"], f"{where}.gateway", subnet)
        if item.get("gateway")
        else subnet.network_address + 1
    )
    return Range(
        subnet, start, end, gateway, _block_size(item.get("blockSize"), where, subnet), where
    )


def parse_gateway(value: Any, key: str, subnet: IPNet) -> IPAddr:
    """A range's explicit gateway: a host address of its own subnet (one outside it may be an
    address another range set hands out, and the bridge holds it with the subnet's prefix)."""
    ip = parse_ip(value, key, subnet)
    if ip not in subnet or is_reserved_v4(subnet, ip):
        raise invalid(key, f"{ip} is not a host address of network {subnet}")
    return ip


def _range_limits(item: Mapping, where: str, subnet: IPNet) -> tuple[IPAddr, IPAddr]:
    start = subnet.network_address + 1
    end = subnet.broadcast_address - (1 if subnet.version == 4 else 0)
    if item.get("rangeStart"):
        start = parse_ip(item["rangeStart"], f"{where}.rangeStart", subnet)
    if item.get("rangeEnd"):
        end = parse_ip(item["rangeEnd"], f"{where}.rangeEnd", subnet)
    for key, ip in (("rangeStart", start), ("rangeEnd", end)):
        if ip not in subnet:
            raise invalid(f"{where}.{key}", f"{ip} is not in network {subnet}")
    if int(start) > int(end):  # both in subnet, so of one family
        raise invalid(f"{where}.rangeStart", f"{start} is after rangeEnd {end}")
    return start, end


def _block_size(value: Any, where: str, subnet: IPNet) -> int | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 0 <= value <= subnet.max_prefixlen
    ):
        raise invalid(
            f"{where}.blockSize",
            f"expected a prefix length 0..{subnet.max_prefixlen}, got {value!r}",
        )
    return value


def validate_no_overlap(sets: tuple[tuple[Range, ...], ...]) -> None:
    """Range sets must not share addresses; within a set, one subnet may hold several
    disjoint ranges."""
    flat = [(i, rng) for i, ranges in enumerate(sets) for rng in ranges]
    for n, (i, a) in enumerate(flat):
        for j, b in flat[n + 1 :]:
            if a.subnet.version != b.subnet.version or not a.subnet.overlaps(b.subnet):
                continue
            if (
                i == j
                and a.subnet == b.subnet
                and (int(a.end) < int(b.start) or int(b.end) < int(a.start))
            ):
                continue
            raise invalid(b.where, f"{b.describe()} overlaps {a.where} {a.describe()}")

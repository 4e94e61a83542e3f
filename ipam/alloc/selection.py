"""Which pools serve a request (pure): netconf ranges, pools named in the netconf, or the
cluster pools whose node selector matches this node.

- ``ipam.ranges`` / ``ipam.subnet`` / the ``ipRanges`` capability: netconf pools,
  one address per range set.
- ``ipam.pools: [names]``: cluster pools by name; one address per IP family, the named pools of
  a family tried in the order given (dual-stack is all-or-nothing).
- neither: every enabled cluster pool whose ``nodeSelector`` matches this node's labels (daemon
  config ``nodeLabels``), one address per family, the pools of a family by name.

A *set* is the pools one address comes from; sets are IPv4 first, then IPv6.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from typing import Protocol

from cni.spec.errors import AddressExhausted, InvalidConfig
from ipam.alloc.allocator import IPAddr, Pool, Range

RangeSets = tuple[tuple[Range, ...], ...]
PoolSets = tuple[tuple[Pool, ...], ...]


class SourcedIP(Protocol):
    """A requested address and where it was asked for (``plugins.ipam.requested.Requested``)."""

    @property
    def ip(self) -> IPAddr: ...

    @property
    def source(self) -> str: ...


RequestedIP = IPAddr | SourcedIP


@dataclass(frozen=True)
class Selection:
    network: str
    range_sets: RangeSets = ()
    pools: tuple[str, ...] = ()  # netconf `ipam.pools`
    gateway_key: str = ""  # the main plugin's key that puts a gateway on the node, if set

    @property
    def mode(self) -> str:
        return "ranges" if self.range_sets else "pools" if self.pools else "selector"


def missing_gateway(pool: str, address: str, key: str) -> InvalidConfig:
    """The refusal of an address from a pool that hands out no gateway when the main plugin
    (``key``: isGateway / isDefaultGateway) would put one on the node: it would have to guess
    one, and the guess (the subnet's first address) is an address the pool hands out."""
    return InvalidConfig(
        f"pool {pool} hands out no gateway, but the netconf sets {key}",
        f"{address} would come with no gateway for the bridge; give the "
        f"pool gateways: pycni ipam pool set {pool} --gateway first",
    )


def as_selection(network: str, value: Selection | RangeSets) -> Selection:
    return value if isinstance(value, Selection) else Selection(network, tuple(value))


def matches(selector: Mapping[str, str] | str | None, labels: Mapping[str, str]) -> bool:
    """Every label of the selector has that value on the node; empty / "all()" selects all."""
    if selector in (None, "", "all()"):
        return True
    if not isinstance(selector, Mapping):
        return False
    return all(labels.get(key) == value for key, value in selector.items())


def group_by_family(pools: Iterable[Pool]) -> PoolSets:
    """The pools as sets per family (IPv4 first), each keeping the given order."""
    by_family: dict[int, list[Pool]] = {}
    for pool in pools:
        by_family.setdefault(pool.family, []).append(pool)
    return tuple(tuple(by_family[f]) for f in sorted(by_family))


def select_by_labels(pools: Iterable[Pool], labels: Mapping[str, str], node: str) -> PoolSets:
    """Enabled cluster pools selecting this node; AddressExhausted when there is none."""
    chosen = sorted(
        (
            p
            for p in pools
            if p.source == "cluster" and not p.disabled and matches(p.spec.node_selector, labels)
        ),
        key=lambda p: p.name,
    )
    if not chosen:
        shown = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "none"
        raise AddressExhausted(
            f"no IP pool selects node {node}",
            f"no enabled pool's nodeSelector matches its labels ({shown}); "
            "name pools in ipam.pools or add one with 'pycni ipam pool add'",
        )
    return group_by_family(chosen)


def select_by_name(names: tuple[str, ...], found: Mapping[str, Pool]) -> PoolSets:
    """The named pools as sets per family; InvalidConfig naming a pool that does not exist."""
    missing = [(i, name) for i, name in enumerate(names) if name not in found]
    if missing:
        index, name = missing[0]
        raise InvalidConfig(
            f"invalid ipam.pools[{index}]: no IP pool named {name!r}",
            "create it with 'pycni ipam pool add' or fix the netconf",
        )
    return group_by_family(found[name] for name in dict.fromkeys(names))


def assign_requested(sets: PoolSets, requested: Iterable[RequestedIP]) -> dict[int, IPAddr]:
    """Map each requested address (an IP or an object with ``.ip`` and ``.source``) to the
    set it is leased from; InvalidConfig when it is in no pool, never handed out, or a
    second address for one set."""
    out: dict[int, tuple[IPAddr, str]] = {}
    for item in requested:
        if isinstance(item, IPv4Address | IPv6Address):
            ip, source = item, "requested"
        else:
            ip, source = item.ip, item.source
        index = _set_of(sets, ip, source)
        if index in out:
            first, first_source = out[index]
            raise InvalidConfig(
                f"two IPv{ip.version} addresses requested",
                f"{first} ({first_source}) and {ip} ({source}); one address "
                "is leased per IP family",
            )
        out[index] = (ip, source)
    return {index: ip for index, (ip, _) in out.items()}


def _set_of(sets: PoolSets, ip: IPAddr, source: str) -> int:
    for index, pools in enumerate(sets):
        for pool in pools:
            if ip.version != pool.family or ip not in pool.cidr:
                continue
            reason = pool.spec.unallocatable_reason(ip)
            if reason is not None:
                raise InvalidConfig(
                    f"requested address {ip} ({source}) is never handed out",
                    f"in pool {pool.name}: {reason}",
                )
            return index
    known = "; ".join(f"{p.name} {p.cidr}" for pools in sets for p in pools)
    raise InvalidConfig(
        f"requested address {ip} ({source}) is outside every pool", f"pools: {known}"
    )

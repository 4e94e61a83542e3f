"""What the kernel of this node should hold for its peers (pure, no I/O).

From the node registry (``registry.py``) and this node's device indexes, ``calc_desired`` gives
the entries pycni owns on this node; the reconciler (``dataplane.py``) diffs them against what
the kernel has with pycni's marks and applies the difference. Per remote node:

- ``vxlan``: an FDB entry VTEP MAC -> underlay address, a permanent neighbour per VTEP address
  -> VTEP MAC, and a route per block of the peer ``via <VTEP address> dev <vxlan> onlink``;
- ``host-gw``: a route per block ``via <underlay address> dev <underlay device>``, only for a
  peer on a directly connected subnet (the others are reported, ``Plan.unreachable``).

Borrowed addresses (a Pod holding an address in another node's block) are host routes (/32,
/128) to the node that holds them, which win over the block owner's route by prefix length;
on the holder itself a host route points at the local device (the bridge) that serves it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from nodes.record import OverlayInfo

IPNet = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Peer:
    """A remote node as the overlay sees it: how to reach it and what it serves."""

    name: str
    info: OverlayInfo
    blocks: tuple[str, ...] = ()  # its blocks (affinity index), CIDRs
    hosts: tuple[str, ...] = ()  # addresses it holds in other nodes' blocks
    held6: tuple[str, ...] = ()  # every IPv6 address it holds (its Pods, its VTEP)


@dataclass(frozen=True, order=True)
class RouteEntry:
    dst: str  # CIDR
    via: str | None  # gateway (None: a device route)
    oif: int
    onlink: bool = False


@dataclass(frozen=True, order=True)
class NeighEntry:
    ifindex: int
    ip: str
    mac: str


@dataclass(frozen=True, order=True)
class FdbEntry:
    ifindex: int
    mac: str
    dst: str


@dataclass(frozen=True, order=True)
class ProxyEntry:
    """A bridge answering neighbour solicitations for a remote Pod's IPv6 address."""

    ifindex: int
    ip: str


@dataclass(frozen=True)
class Entries:
    routes: frozenset[RouteEntry] = frozenset()
    neighs: frozenset[NeighEntry] = frozenset()
    fdbs: frozenset[FdbEntry] = frozenset()
    proxies: frozenset[ProxyEntry] = frozenset()


@dataclass(frozen=True)
class Local:
    """This node's side: its backend, the device peers are programmed on, and where a local
    address is served (``serving(ip)`` -> ifindex of the bridge holding its subnet, or None)."""

    backend: str
    ifindex: int  # the vxlan device (vxlan) or the underlay device (host-gw)
    own_hosts: tuple[str, ...] = ()  # addresses this node holds in other nodes' blocks
    serving: Callable[[str], int | None] = lambda ip: None
    direct: Callable[[str], str | None] = lambda ip: None  # None: directly connected
    towards: Callable[[str], int | None] = lambda ip: None  # device a peer is reached on


@dataclass(frozen=True)
class Plan:
    entries: Entries
    unreachable: Mapping[str, str] = field(default_factory=dict)  # peer -> why no route
    skipped: Mapping[str, str] = field(default_factory=dict)  # peer -> why not programmed


def host_net(ip: str) -> str:
    address = ipaddress.ip_address(ip)
    return f"{address}/{address.max_prefixlen}"


def version_of(cidr_or_ip: str) -> int:
    return ipaddress.ip_network(cidr_or_ip, strict=False).version


def calc_desired(local: Local, peers: Iterable[Peer]) -> Plan:
    routes: set[RouteEntry] = set()
    neighs: set[NeighEntry] = set()
    fdbs: set[FdbEntry] = set()
    proxies: set[ProxyEntry] = set()
    unreachable: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for peer in sorted(peers, key=lambda p: p.name):
        why = calc_skip(local, peer)
        if why:
            skipped[peer.name] = why
            continue
        if local.backend == "vxlan":
            add_vxlan_peer(local, peer, routes, neighs, fdbs)
        elif (reason := local.direct(peer.info.underlay)) is not None:
            unreachable[peer.name] = reason
            continue
        else:
            routes.update(
                peer_routes(
                    peer,
                    calc_direct_gateway(peer.info.underlay),
                    local.towards(peer.info.underlay) or local.ifindex,
                    onlink=False,
                )
            )
        proxies.update(peer_proxies(local, peer))
    routes.update(own_host_routes(local))
    return Plan(
        Entries(frozenset(routes), frozenset(neighs), frozenset(fdbs), frozenset(proxies)),
        unreachable,
        skipped,
    )


def calc_direct_gateway(underlay: str) -> Callable[[int], str | None]:
    """A direct route's gateway by family: the peer's underlay address, in its own family."""
    return lambda version: underlay if version == version_of(underlay) else None


def calc_skip(local: Local, peer: Peer) -> str | None:
    """Why a peer gets no entries at all (None: it gets them)."""
    if peer.info.backend != local.backend:
        return f"its backend is {peer.info.backend}, this node's is {local.backend}"
    if local.backend == "vxlan" and not (peer.info.vtep_mac and peer.info.vteps):
        return "it has no VTEP yet"
    return None


def add_vxlan_peer(local: Local, peer: Peer, routes: set, neighs: set, fdbs: set) -> None:
    info = peer.info
    fdbs.add(FdbEntry(local.ifindex, info.vtep_mac, info.underlay))
    neighs.update(NeighEntry(local.ifindex, v, info.vtep_mac) for v in info.vteps)
    routes.update(peer_routes(peer, info.vtep, local.ifindex, onlink=True))


def peer_routes(
    peer: Peer, gateway: Callable[[int], str | None], oif: int, onlink: bool
) -> set[RouteEntry]:
    """A route per block and per borrowed address of ``peer``, for each family it has a
    gateway of (``gateway(version)``)."""
    out = set()
    for dst in (*peer.blocks, *(host_net(h) for h in peer.hosts)):
        via = gateway(version_of(dst))
        if via is not None:
            out.add(RouteEntry(str(ipaddress.ip_network(dst)), via, oif, onlink))
    return out


def peer_proxies(local: Local, peer: Peer) -> set[ProxyEntry]:
    """The peer's IPv6 addresses, answered for by the local bridge whose subnet holds them (a
    Pod there takes them as on-link and solicits them)."""
    out = set()
    for ip in peer.held6:
        oif = local.serving(ip)
        if oif is not None:
            out.add(ProxyEntry(oif, ip))
    return out


def own_host_routes(local: Local) -> set[RouteEntry]:
    """This node's borrowed addresses, routed to the bridge that serves them (the owner's
    block route through the overlay would otherwise take them)."""
    out = set()
    for ip in local.own_hosts:
        oif = local.serving(ip)
        if oif is not None:
            out.add(RouteEntry(host_net(ip), None, oif))
    return out

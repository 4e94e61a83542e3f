"""The underlay: which address and device carry a node's overlay traffic, and how far a peer is.

Mechanism for the overlay (policy lives in the reconciler): every function takes the IPRoute of
the netns to look in (pycnid's: the node's). Netlink messages are read into small frozen facts
(``RouteFacts``, ``AddrFacts``) and the choices are pure functions of those, so they are tested
with generated input, without a kernel.

``resolve_underlay`` picks, in order: the configured ``overlay.underlayAddress`` (which must be
on a local interface), the primary address of the default route's device (IPv4, then IPv6),
then the node record's address (the source address towards etcd). ``check_direct`` says
whether a peer's underlay address is on a directly connected subnet (host-gw routes only
those: a route via a gateway that does not know the Pod networks would black-hole them).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from cni.spec.errors import InvalidConfig

MAIN_TABLE = 254
RTN_UNICAST, RTN_LOCAL = 1, 2
IFA_F_SECONDARY, IFA_F_DADFAILED, IFA_F_DEPRECATED = 0x01, 0x08, 0x20
UNUSABLE = IFA_F_DADFAILED | IFA_F_DEPRECATED  # never chosen as the underlay address
RT_SCOPE_UNIVERSE = 0
OVERHEAD = {4: 50, 6: 70}  # outer IP + UDP + VXLAN + inner Ethernet headers
MIN_MTU = 68  # the least an IPv4 link may carry (RFC 791)
CONFIG_KEY = "overlay.underlayAddress"


@dataclass(frozen=True)
class Underlay:
    """Where this node's VXLAN packets leave from (and what peers send them to)."""

    address: str
    ifindex: int
    ifname: str
    mtu: int
    version: int
    source: str = ""  # configured | default route | node address: for logs and `node show`


@dataclass(frozen=True)
class RouteFacts:
    """What the underlay choices need of one route message."""

    table: int
    dst_len: int
    type: int
    oif: int | None = None
    gateway: str | None = None
    prefsrc: str | None = None
    priority: int = 0


@dataclass(frozen=True)
class AddrFacts:
    index: int
    address: str
    scope: int = RT_SCOPE_UNIVERSE
    flags: int = 0

    @property
    def version(self) -> int:
        return ipaddress.ip_address(self.address).version


# -- pure choices -----------------------------------------------------------------------------


def calc_overlay_mtu(underlay_mtu: int, underlay_version: int) -> int:
    """The MTU inside the tunnel: the underlay's minus the VXLAN encapsulation (50 bytes over
    IPv4, 70 over IPv6). An underlay too small to carry an IPv4 packet inside is refused."""
    if underlay_version not in OVERHEAD:
        raise ValueError(f"IP version {underlay_version} is neither 4 nor 6")
    mtu = underlay_mtu - OVERHEAD[underlay_version]
    if mtu < MIN_MTU:
        raise InvalidConfig(
            f"underlay MTU {underlay_mtu} is too small for VXLAN",
            f"the tunnel would carry {mtu} bytes, less than {MIN_MTU}",
        )
    return mtu


def pick_default_route(routes: Iterable[RouteFacts]) -> RouteFacts | None:
    """The default route the kernel prefers in the main table (lowest metric) with a device."""
    usable = [
        r
        for r in routes
        if r.table == MAIN_TABLE and r.dst_len == 0 and r.type == RTN_UNICAST and r.oif is not None
    ]
    return min(usable, key=lambda r: r.priority, default=None)


def pick_primary_address(
    addrs: Iterable[AddrFacts], index: int, version: int, prefer: str | None = None
) -> str | None:
    """The device's primary global address of ``version``; ``prefer`` (a route's source
    address) wins when the device holds it, as the kernel would send from it."""
    usable = [
        a
        for a in addrs
        if a.index == index
        and a.version == version
        and a.scope == RT_SCOPE_UNIVERSE
        and not a.flags & UNUSABLE
    ]
    if prefer is not None and any(a.address == prefer for a in usable):
        return prefer
    return next((a.address for a in usable if not a.flags & IFA_F_SECONDARY), None)


def calc_direct_reason(route: RouteFacts | None) -> str | None:
    """None when the route reaches its destination on a connected subnet; else why not."""
    if route is None:
        return "no route"
    if route.type == RTN_LOCAL:
        return "a local address of this node"
    if route.type != RTN_UNICAST:
        return f"no route (route type {route.type})"
    if route.gateway is not None:
        return f"not directly connected: routed via gateway {route.gateway}"
    return None


def normalize(address: str) -> str | None:
    """The canonical text of an IP address; None when it is not one."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None


# -- reading the kernel -----------------------------------------------------------------------


def read_route(msg: Any) -> RouteFacts:
    oif = msg.get("RTA_OIF")
    if oif is None and msg.get("RTA_MULTIPATH"):
        oif = msg.get("RTA_MULTIPATH")[0]["oif"]  # a multipath default: its first hop
    return RouteFacts(
        msg.get("RTA_TABLE") or msg["table"],
        msg["dst_len"],
        msg["type"],
        oif,
        msg.get("RTA_GATEWAY"),
        msg.get("RTA_PREFSRC"),
        msg.get("RTA_PRIORITY") or 0,
    )


def read_addr(msg: Any) -> AddrFacts:
    address = msg.get("IFA_LOCAL") or msg.get("IFA_ADDRESS")  # IFA_LOCAL: ours on a p2p link
    return AddrFacts(
        msg["index"],
        str(ipaddress.ip_address(address)),
        msg["scope"],
        msg.get("IFA_FLAGS") or msg["flags"],
    )


def list_addrs(ipr: IPRoute) -> list[AddrFacts]:
    return [read_addr(m) for m in ipr.addr("dump")]


def default_underlay(ipr: IPRoute) -> tuple[str, int] | None:
    """(address, ifindex): the primary address of the IPv4 default route's device, else the
    IPv6 one's; None without a default route (or when its device has no global address)."""
    addrs = list_addrs(ipr)
    for family, version in ((socket.AF_INET, 4), (socket.AF_INET6, 6)):
        route = pick_default_route(read_route(m) for m in ipr.route("dump", family=family))
        if route is None or route.oif is None:
            continue
        address = pick_primary_address(addrs, route.oif, version, route.prefsrc)
        if address is not None:
            return address, route.oif
    return None


def device_of(ipr: IPRoute, address: str) -> int | None:
    """The ifindex of the interface holding ``address`` in this netns; None when none does."""
    wanted = normalize(address)
    return next((a.index for a in list_addrs(ipr) if a.address == wanted), None)


def device_mtu(ipr: IPRoute, index: int) -> int:
    return int(ipr.link("get", index=index)[0].get("IFLA_MTU"))


def route_to(ipr: IPRoute, address: str) -> RouteFacts | None:
    """The route the kernel would take to ``address`` (RTM_GETROUTE); None: unreachable."""
    try:
        return read_route(ipr.route("get", dst=address)[0])
    except NetlinkError as exc:
        if exc.code in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EINVAL, errno.EACCES):
            return None  # no route, or an unreachable/blackhole/prohibit one
        raise


def check_direct(ipr: IPRoute, address: str) -> str | None:
    """None when ``address`` is on a directly connected subnet; else the reason it is not
    (the gateway it would go through, "no route", or that it is this node's own)."""
    if normalize(address) is None:
        return f"{address!r} is not an IP address"
    return calc_direct_reason(route_to(ipr, address))


def device_towards(ipr: IPRoute, address: str) -> int | None:
    """The device the kernel sends to ``address`` on (a host-gw peer may be reached on
    another device than the one holding this node's underlay address); None: no route."""
    route = route_to(ipr, address) if normalize(address) else None
    return route.oif if route else None


def describe_device(ipr: IPRoute, address: str, index: int, source: str) -> Underlay:
    link = ipr.link("get", index=index)[0]
    return Underlay(
        address,
        index,
        str(link.get("IFLA_IFNAME")),
        int(link.get("IFLA_MTU")),
        ipaddress.ip_address(address).version,
        source,
    )


def resolve_underlay(ipr: IPRoute, configured: str | None, fallback: str | None) -> Underlay:
    """This node's underlay: ``configured`` (must be local) > the default route's device's
    address > ``fallback`` (the node record's address) > InvalidConfig saying what to set."""
    if configured:
        return describe_device(ipr, *find_configured(ipr, configured), "configured")
    found = default_underlay(ipr)
    if found is not None:
        return describe_device(ipr, *found, "default route")
    address = normalize(fallback) if fallback else None
    index = device_of(ipr, fallback) if fallback and address else None
    if address and index is not None:
        return describe_device(ipr, address, index, "node address")
    raise InvalidConfig(
        f"no underlay address for the overlay: set {CONFIG_KEY}",
        "this node has no default route"
        + (
            f", and its node address {fallback} is not on any of its interfaces"
            if fallback
            else " and no node address"
        ),
    )


def find_configured(ipr: IPRoute, configured: str) -> tuple[str, int]:
    address = normalize(configured)
    if address is None:
        raise InvalidConfig(f"invalid {CONFIG_KEY} {configured!r}", "expected an IP address")
    index = device_of(ipr, address)
    if index is None:
        raise InvalidConfig(
            f"{CONFIG_KEY} {address} is not an address of this node",
            "no interface in pycnid's network namespace holds it",
        )
    return address, index

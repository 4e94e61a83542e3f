"""Routes over netlink (pyroute2). No CNI policy here.

Routes are appended (NLM_F_CREATE|NLM_F_APPEND, the reference's RouteAddEcmp), not added
exclusively: a route to a destination another device already routes (a Pod's second default
route, on its second interface) is installed next to it — for IPv6 as another nexthop of one
multipath route. EEXIST then means exactly this route (dst, gateway, device, metric) exists.

The overlay's routes are replaced instead (one route per destination, pycni's own) and carry
pycni's route protocol ``RTPROT_PYCNI``: that number is how pycni tells its routes from anyone
else's when it lists and removes them, so a delete names it too (the kernel takes protocol 0
in a delete as "any protocol").
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from dataclasses import dataclass, replace
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

MAIN_TABLE = 254
RTPROT_PYCNI = 77  # rtm_protocol of every route pycni's overlay programs
RTNH_F_ONLINK = 4  # the gateway is on the device, whatever its addresses say
RTN_UNICAST = 1
GONE = (errno.ESRCH, errno.ENOENT)  # what a delete of a route that is not there answers


@dataclass(frozen=True)
class Route:
    dst: IPv4Network | IPv6Network
    gw: IPv4Address | IPv6Address | None = None
    oif: int | None = None
    priority: int | None = None
    table: int | None = None
    scope: int | None = None
    mtu: int | None = None
    advmss: int | None = None
    proto: int | None = None  # rtm_protocol; None: the kernel's default (boot)
    onlink: bool = False  # RTNH_F_ONLINK

    @property
    def family(self) -> int:
        return socket.AF_INET if self.dst.version == 4 else socket.AF_INET6


def add_route(ipr: IPRoute, route: Route, *, exist_ok: bool = False) -> None:
    """Append ``route``; ``exist_ok``: this very route being there already is fine."""
    try:
        ipr.route("append", **route_request(route))
    except NetlinkError as exc:
        if not (exist_ok and exc.code == errno.EEXIST):
            raise


def route_request(route: Route) -> dict:
    """The pyroute2 arguments of one route (pure)."""
    args: dict = {"dst": str(route.dst), "family": route.family}
    for key in ("oif", "priority", "table", "scope"):
        if getattr(route, key) is not None:
            args[key] = getattr(route, key)
    if route.gw is not None:
        args["gateway"] = str(route.gw)
    if route.proto is not None:
        args["proto"] = route.proto
    if route.onlink:
        args["flags"] = RTNH_F_ONLINK
    metrics = {k: getattr(route, k) for k in ("mtu", "advmss") if getattr(route, k)}
    if metrics:
        args["metrics"] = metrics
    return args


def list_routes(ipr: IPRoute, version: int, table: int | None = MAIN_TABLE) -> list[Route]:
    """Unicast routes of one family (in ``table``, or all tables when None); a multipath
    route is listed once per nexthop (its gateway and device)."""
    family = socket.AF_INET if version == 4 else socket.AF_INET6
    out = []
    for msg in ipr.route("dump", family=family):
        msg_table = msg.get("RTA_TABLE") or msg["table"]
        if table is None or msg_table == table:
            out += routes_of(msg, version, msg_table)
    return out


def routes_of(msg, version: int, table: int) -> list[Route]:
    dst = msg.get("RTA_DST") or ("0.0.0.0" if version == 4 else "::")
    network = ipaddress.ip_network(f"{dst}/{msg['dst_len']}", strict=False)
    hops = [(nh.get("RTA_GATEWAY"), nh["oif"]) for nh in msg.get("RTA_MULTIPATH") or ()]
    return [
        Route(
            dst=network,
            gw=ipaddress.ip_address(gw) if gw else None,
            oif=oif,
            priority=msg.get("RTA_PRIORITY"),
            table=table,
        )
        for gw, oif in hops or [(msg.get("RTA_GATEWAY"), msg.get("RTA_OIF"))]
    ]


def replace_route(ipr: IPRoute, route: Route) -> None:
    """Install ``route`` in place of any route to the same destination (and metric)."""
    ipr.route("replace", **route_request(route))


def delete_route(ipr: IPRoute, route: Route) -> bool:
    """Delete ``route`` (matched on its protocol too, when it has one). False when it was
    already gone."""
    try:
        ipr.route("del", **route_request(route))
    except NetlinkError as exc:
        if exc.code in GONE:
            return False
        raise
    return True


def list_proto_routes(ipr: IPRoute, proto: int, version: int | None = None) -> list[Route]:
    """The unicast routes of the main table with protocol ``proto`` (both families when
    ``version`` is None: one dump), with dst, gw, oif, onlink, scope and proto filled."""
    family = {None: socket.AF_UNSPEC, 4: socket.AF_INET, 6: socket.AF_INET6}[version]
    out = []
    for msg in ipr.route("dump", family=family):
        if msg["proto"] == proto and is_main_unicast(msg):
            out += proto_routes_of(msg)
    return out


def is_main_unicast(msg) -> bool:
    return msg["type"] == RTN_UNICAST and (msg.get("RTA_TABLE") or msg["table"]) == MAIN_TABLE


def proto_routes_of(msg) -> list[Route]:
    """A dumped route as the overlay reads it back: one Route per nexthop, table left None
    (the main table, what a request without one means)."""
    version = 4 if msg["family"] == socket.AF_INET else 6
    return [
        replace(
            route,
            table=None,
            priority=None,
            scope=msg["scope"],
            proto=msg["proto"],
            onlink=bool(flags & RTNH_F_ONLINK),
        )
        for route, flags in zip(
            routes_of(msg, version, MAIN_TABLE), nexthop_flags(msg), strict=True
        )
    ]


def nexthop_flags(msg) -> list[int]:
    """rtm_flags of a single-path route, or each nexthop's flags of a multipath one."""
    return [nh["flags"] for nh in msg.get("RTA_MULTIPATH") or ()] or [msg["flags"]]

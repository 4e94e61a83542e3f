"""Routes over netlink (pyroute2). No CNI policy here.

Routes are appended (NLM_F_CREATE|NLM_F_APPEND, the reference's RouteAddEcmp), not added
exclusively: a route to a destination another device already routes (a Pod's second default
route, on its second interface) is installed next to it — for IPv6 as another nexthop of one
multipath route. EEXIST then means exactly this route (dst, gateway, device, metric) exists.
"""
from __future__ import annotations

import errno
import ipaddress
import socket
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

MAIN_TABLE = 254


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
    return [Route(dst=network, gw=ipaddress.ip_address(gw) if gw else None, oif=oif,
                  priority=msg.get("RTA_PRIORITY"), table=table)
            for gw, oif in hops or [(msg.get("RTA_GATEWAY"), msg.get("RTA_OIF"))]]

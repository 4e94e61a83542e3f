"""Reconciling the kernel with the desired entries: read what carries pycni's marks, diff, apply.

Ownership: routes by their protocol (``RTPROT_PYCNI``, 77, in the main table), neighbours by
``NDA_PROTOCOL`` 77 on the VXLAN device. The VXLAN driver keeps no protocol on FDB entries, so an
FDB entry on pycni's device is pycni's when its MAC is a VTEP MAC pycni wants, one of its own
neighbour entries names, or one this pycnid programmed before (``wanted_macs`` is the caller's
memory of those); IPv6 proxy entries on bridges (``ndproxy``) by their protocol.
Removal therefore goes routes, FDB, neighbours (a crash in between
leaves a neighbour that still names the FDB entry's MAC), addition the other way round
(neighbour before the route that needs it, as flannel learned). A route whose gateway changed is
replaced in one request, so traffic never sees it missing. Foreign entries are never touched.

Each entry is applied on its own: one the kernel refuses is logged and counted (``Outcome``) and
the rest still go in; the next pass tries it again.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from kernel import ndproxy, neigh, route
from kernel.route import RTPROT_PYCNI
from overlay.model import Entries, FdbEntry, NeighEntry, ProxyEntry, RouteEntry

log = logging.getLogger("pycnid.overlay")
SCOPE_LINK = 253


@dataclass
class Outcome:
    added: int = 0
    removed: int = 0
    failed: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed)


def read_actual(ipr: IPRoute, vxlan_index: int | None, wanted_macs: set[str]) -> Entries:
    routes = frozenset(
        RouteEntry(str(r.dst), str(r.gw) if r.gw else None, r.oif or 0, r.onlink)
        for r in route.list_proto_routes(ipr, RTPROT_PYCNI)
    )
    proxies = frozenset(
        ProxyEntry(p.ifindex, p.ip) for p in ndproxy.list_proxies(ipr, proto=RTPROT_PYCNI)
    )
    if vxlan_index is None:
        return Entries(routes, proxies=proxies)
    neighs = frozenset(
        NeighEntry(n.ifindex, str(n.ip), n.mac)
        for n in neigh.list_neighs(ipr, vxlan_index, proto=RTPROT_PYCNI)
    )
    ours = wanted_macs | {n.mac for n in neighs}
    fdbs = frozenset(
        FdbEntry(f.ifindex, f.mac, str(f.dst))
        for f in neigh.list_fdb(ipr, vxlan_index)
        if f.mac in ours
    )
    return Entries(routes, neighs, fdbs, proxies)


def kernel_route(entry: RouteEntry) -> route.Route:
    return route.Route(
        dst=ipaddress.ip_network(entry.dst),
        gw=ipaddress.ip_address(entry.via) if entry.via else None,
        oif=entry.oif,
        proto=RTPROT_PYCNI,
        onlink=entry.onlink,
        scope=None if entry.via else SCOPE_LINK,
    )


def apply_diff(ipr: IPRoute, desired: Entries, actual: Entries) -> Outcome:
    out = Outcome()
    wanted_dsts = {r.dst for r in desired.routes}
    for entry in sorted(actual.routes - desired.routes):
        if entry.dst not in wanted_dsts:  # a changed one is replaced below
            attempt(
                out,
                f"delete route {entry.dst}",
                False,
                lambda e=entry: route.delete_route(ipr, kernel_route(e)),
            )
    for fdb in sorted(actual.fdbs - desired.fdbs):
        attempt(
            out,
            f"delete fdb {fdb.mac} dst {fdb.dst}",
            False,
            lambda f=fdb: neigh.delete_fdb(ipr, f.ifindex, f.mac, f.dst),
        )
    for nb in sorted(actual.neighs - desired.neighs):
        attempt(
            out,
            f"delete neighbour {nb.ip}",
            False,
            lambda n=nb: neigh.delete_neigh(ipr, n.ifindex, n.ip),
        )
    for proxy in sorted(actual.proxies - desired.proxies):
        attempt(
            out,
            f"delete proxy neighbour {proxy.ip}",
            False,
            lambda p=proxy: ndproxy.delete_proxy(ipr, p.ifindex, p.ip),
        )
    for proxy in sorted(desired.proxies - actual.proxies):
        attempt(
            out,
            f"proxy neighbour {proxy.ip}",
            True,
            lambda p=proxy: ndproxy.add_proxy(ipr, p.ifindex, p.ip),
        )
    for nb in sorted(desired.neighs - actual.neighs):
        attempt(
            out,
            f"neighbour {nb.ip} lladdr {nb.mac}",
            True,
            lambda n=nb: neigh.replace_neigh(ipr, n.ifindex, n.ip, n.mac, RTPROT_PYCNI),
        )
    for fdb in sorted(desired.fdbs - actual.fdbs):
        attempt(
            out,
            f"fdb {fdb.mac} dst {fdb.dst}",
            True,
            lambda f=fdb: neigh.append_fdb(ipr, f.ifindex, f.mac, f.dst),
        )
    for entry in sorted(desired.routes - actual.routes):
        attempt(
            out,
            f"route {entry.dst} via {entry.via or 'the local device'}",
            True,
            lambda e=entry: route.replace_route(ipr, kernel_route(e)),
        )
    return out


def attempt(out: Outcome, what: str, adding: bool, op: Callable[..., object]) -> None:
    try:
        op()
    except NetlinkError as exc:
        if not adding and exc.code in (errno.ESRCH, errno.ENOENT, errno.ENODEV):
            return
        out.failed.append(
            f"{what}: {errno.errorcode.get(exc.code, exc.code)} "
            f"({exc.args[1] if len(exc.args) > 1 else exc})"
        )
        return
    if adding:
        out.added += 1
    else:
        out.removed += 1

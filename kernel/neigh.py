"""Neighbour (ARP/NDP) and VXLAN forwarding-database entries over netlink. No policy here.

The overlay programs, per peer, a permanent neighbour entry (VTEP address -> VTEP MAC) and an
FDB entry (VTEP MAC -> underlay address) on the VXLAN device. Neighbour entries carry pycni's
protocol number (NDA_PROTOCOL, the route protocol ``RTPROT_PYCNI``), so a listing can leave
entries someone else made alone. The vxlan driver does not keep NDA_PROTOCOL on FDB entries:
those belong to whoever owns the device, and ``list_fdb`` returns all of them.

Requests are shaped by pure functions (``*_request``) and read back by pure ones (``*_of``),
so the shapes are tested without a kernel.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from kernel.route import RTPROT_PYCNI

IPAddress = IPv4Address | IPv6Address
NUD_STALE, NUD_PERMANENT = 0x04, 0x80
NTF_SELF = 0x02  # an entry of the device's own table (the vxlan FDB), not a bridge master's
ZERO_MAC = "00:00:00:00:00:00"  # the vxlan "default destination" entries, not a peer
AF_BRIDGE = socket.AF_BRIDGE


@dataclass(frozen=True)
class Neigh:
    ifindex: int
    ip: IPAddress
    mac: str
    proto: int | None  # NDA_PROTOCOL; None when the entry has none (made by hand, by the kernel)


@dataclass(frozen=True)
class Fdb:
    ifindex: int
    mac: str
    dst: IPAddress  # the underlay address VXLAN packets for ``mac`` go to


def family_of(ip: IPAddress) -> int:
    return socket.AF_INET if ip.version == 4 else socket.AF_INET6


def neigh_request(
    ifindex: int,
    ip: IPAddress | str,
    mac: str | None = None,
    proto: int | None = None,
    state: int = NUD_PERMANENT,
) -> dict:
    """The pyroute2 arguments of one neighbour entry (pure: permanent unless ``state`` says
    otherwise); without ``mac``, of its delete."""
    address = ipaddress.ip_address(ip)
    args: dict = {"ifindex": ifindex, "dst": str(address), "family": family_of(address)}
    if mac is not None:
        args.update(lladdr=mac.lower(), state=state)
    if proto is not None:
        args["NDA_PROTOCOL"] = proto
    return args


def neigh_of(msg) -> Neigh | None:
    """A dumped neighbour as a Neigh; None unless it is a permanent IPv4/IPv6 entry."""
    if msg["family"] not in (socket.AF_INET, socket.AF_INET6):
        return None
    if not msg["state"] & NUD_PERMANENT or not msg.get("NDA_DST") or not msg.get("NDA_LLADDR"):
        return None
    return Neigh(
        ifindex=msg["ifindex"],
        ip=ipaddress.ip_address(msg.get("NDA_DST")),
        mac=msg.get("NDA_LLADDR").lower(),
        proto=msg.get("NDA_PROTOCOL"),
    )


def replace_neigh(
    ipr: IPRoute, ifindex: int, ip: IPAddress | str, mac: str, proto: int = RTPROT_PYCNI
) -> None:
    """Make ``ip`` resolve to ``mac`` on the device, permanently (whatever was there before)."""
    ipr.neigh("replace", **neigh_request(ifindex, ip, mac, proto))


def replace_learned_neigh(ipr: IPRoute, ifindex: int, ip: IPAddress | str, mac: str) -> None:
    """Make ``ip`` resolve to ``mac`` on the device as if the kernel had just learned it
    (NUD_STALE: used at once, then confirmed, re-resolved or collected as any entry it made),
    replacing whatever entry was there."""
    ipr.neigh("replace", **neigh_request(ifindex, ip, mac, state=NUD_STALE))


def delete_neigh(ipr: IPRoute, ifindex: int, ip: IPAddress | str) -> bool:
    """Delete the entry for ``ip`` on the device. False when there was none."""
    try:
        ipr.neigh("del", **neigh_request(ifindex, ip))
    except NetlinkError as exc:
        if exc.code == errno.ENOENT:
            return False
        raise
    return True


def list_neighs(ipr: IPRoute, ifindex: int, proto: int | None = None) -> list[Neigh]:
    """The permanent IPv4 and IPv6 entries of the device (one dump); with ``proto``, only
    those carrying that NDA_PROTOCOL."""
    out = []
    for msg in ipr.neigh("dump", ifindex=ifindex):
        neigh = neigh_of(msg)
        if neigh and neigh.ifindex == ifindex and (proto is None or neigh.proto == proto):
            out.append(neigh)
    return out


def fdb_request(ifindex: int, mac: str, dst: IPAddress | str) -> dict:
    """The pyroute2 arguments of one permanent FDB entry of the device itself (pure)."""
    return {
        "ifindex": ifindex,
        "lladdr": mac.lower(),
        "dst": str(ipaddress.ip_address(dst)),
        "state": NUD_PERMANENT,
        "flags": NTF_SELF,
    }


def fdb_of(msg) -> Fdb | None:
    """A dumped FDB entry as an Fdb; None for entries without a destination and the
    all-zero default entries."""
    mac = (msg.get("NDA_LLADDR") or ZERO_MAC).lower()
    if msg["family"] != AF_BRIDGE or not msg.get("NDA_DST") or mac == ZERO_MAC:
        return None
    return Fdb(ifindex=msg["ifindex"], mac=mac, dst=ipaddress.ip_address(msg.get("NDA_DST")))


def append_fdb(ipr: IPRoute, ifindex: int, mac: str, dst: IPAddress | str) -> None:
    """Send frames for ``mac`` to ``dst`` (appended: one MAC may have several destinations).
    The identical entry being there already is fine."""
    try:
        ipr.fdb("append", **fdb_request(ifindex, mac, dst))
    except NetlinkError as exc:
        if exc.code != errno.EEXIST:
            raise


def delete_fdb(ipr: IPRoute, ifindex: int, mac: str, dst: IPAddress | str) -> bool:
    """Delete the entry ``mac`` -> ``dst``. False when ``mac`` has no entry at all (the kernel
    answers a ``dst`` that ``mac`` does not have with success, and deletes nothing)."""
    try:
        ipr.fdb("del", **fdb_request(ifindex, mac, dst))
    except NetlinkError as exc:
        if exc.code == errno.ENOENT:
            return False
        raise
    return True


def list_fdb(ipr: IPRoute, ifindex: int) -> list[Fdb]:
    """The device's FDB entries that have a destination, one per (MAC, destination)."""
    out = []
    for msg in ipr.fdb("dump", ifindex=ifindex):
        entry = fdb_of(msg)
        if entry and entry.ifindex == ifindex:
            out.append(entry)
    return out

"""Proxy neighbour entries (``ip -6 neigh add proxy ADDR dev BR``) over netlink. No policy here.

With ``proxy_ndp`` on a bridge, the kernel answers a neighbour solicitation for an address that
has a proxy entry on that bridge. IPv6 has no "answer for whatever is routed elsewhere" the way
IPv4's ``proxy_arp`` has, so the overlay names each remote Pod address. Entries carry pycni's
protocol (NDA_PROTOCOL) so a listing leaves hand-made ones alone.

pyroute2 0.9's ``neigh('dump')`` cannot put NTF_PROXY into the request header (only the family
reaches the kernel), and without it the kernel dumps the ordinary table; ``list_proxies`` sends
the request message itself (``nlm_request``, whose sync wrapper in 0.9.7 reads a status key
it never sets: set here to the library's default).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from dataclasses import dataclass

from pyroute2 import IPRoute
from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_GETNEIGH
from pyroute2.netlink.rtnl.ndmsg import ndmsg

from kernel.route import RTPROT_PYCNI

NTF_PROXY = 0x08


@dataclass(frozen=True)
class Proxy:
    ifindex: int
    ip: str
    proto: int | None


def proxy_request(ifindex: int, ip: str, proto: int | None = None) -> dict:
    address = ipaddress.ip_address(ip)
    args: dict = {
        "ifindex": ifindex,
        "dst": str(address),
        "flags": NTF_PROXY,
        "family": socket.AF_INET if address.version == 4 else socket.AF_INET6,
    }
    if proto is not None:
        args["NDA_PROTOCOL"] = proto
    return args


def add_proxy(ipr: IPRoute, ifindex: int, ip: str, proto: int = RTPROT_PYCNI) -> None:
    """Add a proxy entry; the same one being there is fine."""
    try:
        ipr.neigh("add", **proxy_request(ifindex, ip, proto))
    except NetlinkError as exc:
        if exc.code != errno.EEXIST:
            raise


def delete_proxy(ipr: IPRoute, ifindex: int, ip: str) -> bool:
    try:
        ipr.neigh("del", **proxy_request(ifindex, ip))
    except NetlinkError as exc:
        if exc.code in (errno.ENOENT, errno.ESRCH, errno.ENODEV):
            return False
        raise
    return True


def proxy_of(msg) -> Proxy | None:
    if not msg["flags"] & NTF_PROXY or not msg.get("NDA_DST"):
        return None
    return Proxy(
        msg["ifindex"], str(ipaddress.ip_address(msg.get("NDA_DST"))), msg.get("NDA_PROTOCOL")
    )


def list_proxies(ipr: IPRoute, proto: int | None = None) -> list[Proxy]:
    """Every proxy entry of the netns (both families), with ``proto`` only when given."""
    ipr.status["nlm_generator"] = False  # its sync wrapper reads a key only set elsewhere
    request = ndmsg()
    request["family"] = socket.AF_UNSPEC
    request["flags"] = NTF_PROXY
    found = (
        proxy_of(m)
        for m in ipr.nlm_request(
            request, msg_type=RTM_GETNEIGH, msg_flags=NLM_F_REQUEST | NLM_F_DUMP
        )
    )
    return [p for p in found if p is not None and (proto is None or p.proto == proto)]

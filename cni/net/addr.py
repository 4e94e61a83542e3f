"""Interface addresses over netlink (pyroute2). No CNI policy here."""
from __future__ import annotations

import errno
import ipaddress
from ipaddress import IPv4Interface, IPv6Interface

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

IFA_F_NODAD = 0x02
IPInterface = IPv4Interface | IPv6Interface


def list_addresses(ipr: IPRoute, index: int) -> list[IPInterface]:
    """Every address on the link (both families, link-local included)."""
    out: list[IPInterface] = []
    for msg in ipr.addr("dump", index=index):
        if msg["index"] != index:
            continue
        out.append(ipaddress.ip_interface(f"{msg.get('IFA_ADDRESS')}/{msg['prefixlen']}"))
    return out


def add_address(ipr: IPRoute, index: int, address: IPInterface, *, nodad: bool = True,
                exist_ok: bool = False) -> None:
    """Add ``address``; IPv6 without duplicate address detection unless ``nodad`` is False."""
    args: dict = {"index": index, "address": str(address.ip), "prefixlen": address.network.prefixlen}
    if address.version == 6 and nodad:
        args["flags"] = IFA_F_NODAD
    try:
        ipr.addr("add", **args)
    except NetlinkError as exc:
        if not (exist_ok and exc.code == errno.EEXIST):
            raise


def delete_address(ipr: IPRoute, index: int, address: IPInterface) -> None:
    try:
        ipr.addr("del", index=index, address=str(address.ip),
                 prefixlen=address.network.prefixlen)
    except NetlinkError as exc:
        if exc.code not in (errno.EADDRNOTAVAIL, errno.ENODEV):
            raise


def is_link_local(address: IPInterface) -> bool:
    return address.ip.is_link_local

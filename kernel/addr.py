"""Interface addresses over netlink (pyroute2). No CNI policy here."""

from __future__ import annotations

import errno
import ipaddress
from ipaddress import IPv4Interface, IPv6Interface

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

IFA_F_NODAD = 0x02
ADDR_PROTO_PYCNI = 99  # IFA_PROTO (kernel >= 6.1) of the addresses pycni puts on a bridge
IPInterface = IPv4Interface | IPv6Interface


def list_addresses(ipr: IPRoute, index: int) -> list[IPInterface]:
    """Every address on the link (both families, link-local included)."""
    return list(list_addresses_by_proto(ipr, index))


def list_addresses_by_proto(ipr: IPRoute, index: int) -> dict[IPInterface, int]:
    """Every address on the link with its IFA_PROTO (0: none given)."""
    out: dict[IPInterface, int] = {}
    for msg in ipr.addr("dump", index=index):
        if msg["index"] != index:
            continue
        address = ipaddress.ip_interface(f"{msg.get('IFA_ADDRESS')}/{msg['prefixlen']}")
        out[address] = msg.get("IFA_PROTO") or 0
    return out


def add_address(
    ipr: IPRoute,
    index: int,
    address: IPInterface,
    *,
    nodad: bool = True,
    exist_ok: bool = False,
    proto: int | None = None,
) -> None:
    """Add ``address``; IPv6 without duplicate address detection unless ``nodad`` is False;
    ``proto`` marks who added it (IFA_PROTO)."""
    try:
        ipr.addr("add", **address_request(index, address, nodad, proto))
    except NetlinkError as exc:
        if not (exist_ok and exc.code == errno.EEXIST):
            raise


def mark_address(ipr: IPRoute, index: int, address: IPInterface, proto: int) -> None:
    """Set the IFA_PROTO of an address the link has (the kernel updates it in place)."""
    ipr.addr("replace", **address_request(index, address, True, proto))


def address_request(index: int, address: IPInterface, nodad: bool, proto: int | None) -> dict:
    args: dict = {
        "index": index,
        "address": str(address.ip),
        "prefixlen": address.network.prefixlen,
    }
    if address.version == 6 and nodad:
        args["flags"] = IFA_F_NODAD
    if proto is not None:
        args["proto"] = proto
    return args


def delete_address(ipr: IPRoute, index: int, address: IPInterface) -> None:
    try:
        ipr.addr("del", index=index, address=str(address.ip), prefixlen=address.network.prefixlen)
    except NetlinkError as exc:
        if exc.code not in (errno.EADDRNOTAVAIL, errno.ENODEV):
            raise


def is_link_local(address: IPInterface) -> bool:
    return address.ip.is_link_local

"""Links over netlink (pyroute2): bridges, veth pairs, bridge-port flags. No CNI policy here."""

from __future__ import annotations

import errno
import os
import re
import socket
from dataclasses import dataclass, replace

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

IFF_UP = 0x1
IFF_PROMISC = 0x100
MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


class LinkError(Exception):
    """A link exists but is not what the caller needs (wrong kind, vanished mid-way)."""


@dataclass(frozen=True)
class LinkInfo:
    index: int
    name: str
    kind: str | None
    mac: str
    mtu: int
    up: bool
    promisc: bool
    master: int | None
    peer_index: int | None  # IFLA_LINK: a veth's peer ifindex (in the peer's netns)
    alias: str | None
    hairpin: bool  # bridge-port hairpin mode (IFLA_BRPORT_MODE)


def link_info(msg) -> LinkInfo:
    linkinfo = msg.get("IFLA_LINKINFO")
    kind = linkinfo.get("IFLA_INFO_KIND") if linkinfo else None
    port = linkinfo.get("IFLA_INFO_SLAVE_DATA") if linkinfo else None
    flags = msg["flags"]
    return LinkInfo(
        index=msg["index"],
        name=msg.get("IFLA_IFNAME"),
        kind=kind,
        mac=(msg.get("IFLA_ADDRESS") or "").lower(),
        mtu=msg.get("IFLA_MTU") or 0,
        up=bool(flags & IFF_UP),
        promisc=bool(flags & IFF_PROMISC),
        master=msg.get("IFLA_MASTER") or None,
        peer_index=msg.get("IFLA_LINK") or None,
        alias=msg.get("IFLA_IFALIAS") or None,
        hairpin=bool(port.get("IFLA_BRPORT_MODE")) if port else False,
    )


def random_mac() -> str:
    """A random locally administered unicast MAC (what the kernel would pick)."""
    raw = bytearray(os.urandom(6))
    raw[0] = (raw[0] & 0xFE) | 0x02
    return ":".join(f"{b:02x}" for b in raw)


def normalize_mac(text: str) -> str | None:
    """'AA-BB-…' / 'aa:bb:…' -> 'aa:bb:…'; None unless it is a unicast MAC."""
    mac = text.strip().lower().replace("-", ":")
    if not MAC_RE.match(mac) or int(mac[:2], 16) & 1 or mac == "00:00:00:00:00:00":
        return None
    return mac


def link_exists(name: str) -> bool:
    """Whether the calling thread's netns has a link ``name`` (one ioctl, no netlink)."""
    try:
        socket.if_nametoindex(name)
    except OSError:
        return False
    return True


def get_link(ipr: IPRoute, name: str | None = None, index: int | None = None) -> LinkInfo | None:
    """The link by name or index; None when there is none."""
    try:
        msgs = ipr.link("get", index=index) if index else ipr.link("get", ifname=name)
    except NetlinkError as exc:
        if exc.code == errno.ENODEV:
            return None
        raise
    return link_info(msgs[0])


def list_links(ipr: IPRoute) -> list[LinkInfo]:
    return [link_info(msg) for msg in ipr.get_links()]


def ensure_bridge(ipr: IPRoute, name: str, mtu: int | None = None) -> tuple[LinkInfo, bool]:
    """The bridge ``name``, created (EEXIST tolerated, MTU and a fixed MAC set on creation) and
    up; returns (bridge, whether this call created it).

    Raises LinkError if ``name`` is some other kind of link.
    """
    link = get_link(ipr, name)
    created = False
    if link is None:
        create: dict[str, str | int] = {"ifname": name, "kind": "bridge", "address": random_mac()}
        if mtu:
            create["mtu"] = mtu
        try:
            ipr.link("add", **create)
            created = True
        except NetlinkError as exc:
            if exc.code != errno.EEXIST:
                raise
        link = get_link(ipr, name)
        if link is None:
            raise LinkError(f"bridge {name} vanished while it was being created")
    if link.kind != "bridge":
        raise LinkError(f"{name} exists and is a {link.kind or 'device'}, not a bridge")
    if not link.up:
        ipr.link("set", index=link.index, state="up")
        link = replace(link, up=True)
    return link, created


def pin_mac(ipr: IPRoute, link: LinkInfo) -> None:
    """Set a bridge's MAC to itself, so it stops following the lowest port MAC."""
    ipr.link("set", index=link.index, address=link.mac)


def set_promisc(ipr: IPRoute, index: int, on: bool = True) -> None:
    ipr.link("set", index=index, flags=IFF_PROMISC if on else 0, change=IFF_PROMISC)


def create_veth(
    ipr: IPRoute,
    host: str,
    peer: str,
    peer_netns_fd: int,
    *,
    host_mac: str,
    peer_mac: str,
    mtu: int | None = None,
    master: int | None = None,
) -> None:
    """A veth pair: ``host`` here (up, on ``master``), ``peer`` created directly in the netns
    of ``peer_netns_fd`` (left down). EEXIST if either name is taken; then nothing is made."""
    host_args: dict = {"ifname": host, "kind": "veth", "address": host_mac, "state": "up"}
    peer_args: dict = {"ifname": peer, "net_ns_fd": peer_netns_fd, "address": peer_mac}
    if mtu:
        host_args["mtu"] = peer_args["mtu"] = mtu
    if master:
        host_args["master"] = master
    ipr.link("add", **host_args, peer=peer_args)


def set_port(
    ipr: IPRoute, index: int, *, alias: str | None = None, hairpin: bool | None = None
) -> None:
    """Label a link (IFLA_IFALIAS) and/or set its bridge-port hairpin mode, in one request."""
    args: dict = {"index": index}
    if alias is not None:
        args["ifalias"] = alias
    if hairpin is not None:
        args.update(kind="bridge_slave", mode=int(hairpin))
    ipr.link("set", **args)


def set_up(ipr: IPRoute, index: int) -> None:
    ipr.link("set", index=index, state="up")


def delete_link(ipr: IPRoute, name: str) -> bool:
    """Delete ``name`` (a veth takes its peer along). False when it did not exist."""
    try:
        ipr.link("del", ifname=name)
    except NetlinkError as exc:
        if exc.code == errno.ENODEV:
            return False
        raise
    return True

"""Cheap interface probes by ioctl (SIOCGIF*), for hot paths where a netlink round trip
through pyroute2 (~0.7 ms, and an address dump that grows with every address on the node)
costs too much. They see the calling thread's netns (the socket is made in it)."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

SIOCGIFFLAGS = 0x8913
SIOCGIFADDR = 0x8915
SIOCGIFNETMASK = 0x891B
IFREQ = "16s16x"


def _ifreq(sock: socket.socket, request: int, name: str) -> bytes:
    return fcntl.ioctl(sock, request, struct.pack(IFREQ, name.encode()[:15]))


def if_flags(name: str) -> int | None:
    """The IFF_* flags of ``name``; None when there is no such link."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            raw = _ifreq(sock, SIOCGIFFLAGS, name)
        except OSError:
            return None
    return struct.unpack_from("H", raw, 16)[0]


def if_primary_ipv4(name: str) -> ipaddress.IPv4Interface | None:
    """The primary IPv4 address of ``name`` with its prefix; None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            addr = _ifreq(sock, SIOCGIFADDR, name)[20:24]
            mask = _ifreq(sock, SIOCGIFNETMASK, name)[20:24]
        except OSError:
            return None
    prefix = bin(int.from_bytes(mask, "big")).count("1")
    return ipaddress.IPv4Interface(f"{socket.inet_ntoa(addr)}/{prefix}")

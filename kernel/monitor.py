"""Netlink notifications of what someone else removed: routes, neighbours, FDB entries, links.

The overlay restores what it programmed within about a second of it being deleted; a resync
alone would take a whole period. ``NetlinkMonitor`` subscribes to the link, neighbour and route
groups in the netns of the thread that calls ``start()`` (a thread inherits its creator's
netns) and calls ``on_event(kind, summary)`` for each deletion and each new link, from its own
thread (``on_event`` must be quick and thread-safe: hand the event over and return).

pyroute2 0.9 keeps an IPRoute's event loop per thread, so the monitor's socket is an
``AsyncIPRoute`` made inside the monitor thread, on an event loop of its own; ``stop()``
cancels the listening task through that loop and returns at once. A socket that fails (the
kernel dropped notifications: ENOBUFS) is reopened by the loop helper, and ``on_event`` gets
``RESUBSCRIBED`` so the owner can resync what it may have missed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from pyroute2 import AsyncIPRoute
from pyroute2.netlink.rtnl import (
    RTMGRP_IPV4_IFADDR,
    RTMGRP_IPV4_ROUTE,
    RTMGRP_IPV6_IFADDR,
    RTMGRP_IPV6_ROUTE,
    RTMGRP_LINK,
    RTMGRP_NEIGH,
)

from common.loop import Loop

if TYPE_CHECKING:
    from common.metrics import Registry

log = logging.getLogger("pycnid.netlink")
GROUPS = (
    RTMGRP_LINK
    | RTMGRP_NEIGH
    | RTMGRP_IPV4_ROUTE
    | RTMGRP_IPV6_ROUTE
    | RTMGRP_IPV4_IFADDR
    | RTMGRP_IPV6_IFADDR
)
DELROUTE, DELNEIGH = "RTM_DELROUTE", "RTM_DELNEIGH"
DELLINK, NEWLINK = "RTM_DELLINK", "RTM_NEWLINK"
NEWADDR = "RTM_NEWADDR"
RESUBSCRIBED = "resubscribed"  # the socket was reopened: notifications may have been lost
OnEvent = Callable[[str, dict], None]


def summary_of(msg) -> tuple[str, dict] | None:
    """(kind, summary) of a notification the overlay acts on; None for the others."""
    kind = msg.get("event")
    if kind == DELROUTE:
        return kind, {
            "family": msg["family"],
            "dst": route_dst(msg),
            "gw": msg.get("RTA_GATEWAY"),
            "oif": msg.get("RTA_OIF"),
            "proto": msg["proto"],
            "table": msg.get("RTA_TABLE") or msg["table"],
        }
    if kind == DELNEIGH:  # family AF_BRIDGE: an FDB entry (dst: the underlay address)
        return kind, {
            "family": msg["family"],
            "ifindex": msg["ifindex"],
            "dst": msg.get("NDA_DST"),
            "mac": msg.get("NDA_LLADDR"),
            "proto": msg.get("NDA_PROTOCOL"),
        }
    if kind == NEWADDR:  # a gateway on a bridge: the overlay may now route through it
        return kind, {
            "index": msg["index"],
            "address": msg.get("IFA_ADDRESS"),
            "prefixlen": msg["prefixlen"],
            "proto": msg.get("IFA_PROTO"),
        }
    if kind in (DELLINK, NEWLINK):
        linkinfo = msg.get("IFLA_LINKINFO")
        return kind, {
            "index": msg["index"],
            "ifname": msg.get("IFLA_IFNAME"),
            "kind": linkinfo.get("IFLA_INFO_KIND") if linkinfo else None,
            "up": bool(msg["flags"] & 1),
        }
    return None


def route_dst(msg) -> str:
    """A route message's destination as a network ("10.22.0.64/26", "::/0")."""
    zero = "0.0.0.0" if msg["family"] == socket.AF_INET else "::"
    return f"{msg.get('RTA_DST') or zero}/{msg['dst_len']}"


class NetlinkMonitor:
    def __init__(
        self, on_event: OnEvent, *, name: str = "netlink-monitor", registry: Registry | None = None
    ) -> None:
        self.on_event = on_event
        self.subscribed = threading.Event()  # set while the socket is bound
        self._lock = threading.Lock()
        self._running: tuple[asyncio.AbstractEventLoop, asyncio.Task] | None = None
        self._opened = 0  # sockets opened so far (the second and later: RESUBSCRIBED)
        self._loop = Loop(name, self._watch, retry=0.5, registry=registry, join_timeout=1.0)

    def start(self, timeout: float = 5.0) -> NetlinkMonitor:
        """Start listening; returns once subscribed (or after ``timeout``), so a change made
        after ``start()`` returns is seen."""
        self._loop.start()
        self.subscribed.wait(timeout)
        return self

    def stop(self) -> None:
        """Stop listening; returns within about a second (the thread is a daemon)."""
        self._loop.stop(wait=False)
        with self._lock:
            if self._running is not None:
                loop, task = self._running
                loop.call_soon_threadsafe(task.cancel)
        self._loop.join()

    def _watch(self) -> float | None:
        """One socket's life: listen until stopped (None: the loop is done) or it fails."""
        asyncio.run(self._listen())
        return None if self._loop.stopping else 0.0

    async def _listen(self) -> None:
        if not self._claim():
            return
        try:
            async with AsyncIPRoute() as ipr:
                await ipr.bind(groups=GROUPS)
                self._subscribed()
                while await self._receive(ipr):
                    pass
        except asyncio.CancelledError:
            pass  # stop()
        finally:
            self.subscribed.clear()
            with self._lock:
                self._running = None

    def _claim(self) -> bool:
        """Publish this thread's loop and task for stop(); False when already stopping."""
        with self._lock:
            if self._loop.stopping:
                return False
            task = asyncio.current_task()
            assert task is not None  # called from the _listen coroutine, inside its task
            self._running = (asyncio.get_running_loop(), task)
            return True

    async def _receive(self, ipr: AsyncIPRoute) -> bool:
        """Hand on one datagram's notifications; raises once the socket has closed (it gives
        nothing then), so the loop helper opens a new one."""
        received = False
        async for msg in ipr.get():
            received = True
            self._dispatch(msg)
        if not received:
            raise ConnectionError("the netlink monitor's socket closed")
        return True

    def _subscribed(self) -> None:
        self._opened += 1
        self.subscribed.set()
        if self._opened > 1:
            self._deliver(RESUBSCRIBED, {})

    def _dispatch(self, msg) -> None:
        event = summary_of(msg)
        if event is not None:
            self._deliver(*event)

    def _deliver(self, kind: str, summary: dict) -> None:
        """Call the owner; its failure is logged and never ends the monitor."""
        try:
            self.on_event(kind, summary)
        except Exception:  # noqa: BLE001 - the owner's bug must not stop the notifications
            log.exception("netlink monitor: handling %s failed", kind)

"""pyroute2 sessions bound to one netns.

pyroute2 0.9 keeps an ``IPRoute``'s netlink socket and asyncio loop per thread (created on
first use, in the calling thread's netns), so a session is only ever used by the thread that
made it.

- Node sessions (pycnid's own netns) are made once per thread and reused by every request the
  thread serves (pycnid's workers are long-lived): building one costs about as much as two
  netlink requests. A session that fails with anything but a kernel answer (``NetlinkError``) or
  a CNI error is closed and made afresh on next use; sessions of threads that have ended are
  closed when another thread makes one; ``close_node_sessions()`` closes all at shutdown.
- Pod sessions are per request: made while the thread is inside the pod netns (``entered``),
  so the socket stays bound there after the thread returns home; work that must run inside the
  pod (sysctls, ioctls) goes in ``inside``.

Never use pyroute2's ``netns=`` argument: it creates missing namespaces.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TypeVar

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from cni.spec.errors import CNIError
from kernel.ns import entered, thread_netns_inode

T = TypeVar("T")
log = logging.getLogger("pycnid.netlink")
# pyroute2 logs every netlink message at DEBUG (a dict repr each): with pycnid at debug level
# that floods the log and costs more than the request itself.
logging.getLogger("pyroute2").setLevel(logging.INFO)
# Failures that leave the session usable: the kernel refused a request, or policy said no.
HARMLESS = (NetlinkError, CNIError)


@dataclass
class _Cached:
    ipr: IPRoute
    thread: threading.Thread
    netns: int
    # pyroute2 keeps these in the thread's locals, which vanish with the thread: held here so
    # that another thread can close them once the owner has ended.
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport  # from the loop's connect_accepted_socket


class NodeSessions:
    """One reusable IPRoute per thread in the node netns."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: dict[int, _Cached] = {}  # by thread ident

    @contextmanager
    def session(self) -> Iterator[IPRoute]:
        cached = self._acquire()
        try:
            yield cached.ipr
        except HARMLESS:
            raise
        except BaseException:
            self._discard(cached)
            raise

    def close_all(self) -> None:
        with self._lock:
            every, self._open = list(self._open.values()), {}
        for cached in every:
            _close(cached, loop_too=not cached.thread.is_alive())

    def _acquire(self) -> _Cached:
        cached: _Cached | None = getattr(self._local, "cached", None)
        netns = thread_netns_inode()
        if cached is not None and cached.netns == netns and not cached.ipr.status["closed"]:
            drop_stray_replies(cached.ipr)
            return cached
        if cached is not None:
            self._discard(cached)
        return self._create(netns)

    def _create(self, netns: int) -> _Cached:
        ipr = IPRoute()
        cached = _Cached(
            ipr,
            threading.current_thread(),
            netns,
            ipr.asyncore.event_loop,
            ipr.asyncore.local.transport,
        )
        with self._lock:
            ended = {ident: c for ident, c in self._open.items() if not c.thread.is_alive()}
            for ident in ended:
                del self._open[ident]
            self._open[threading.get_ident()] = cached
        for c in ended.values():
            _close(c, loop_too=True)
        self._local.cached = cached
        return cached

    def _discard(self, cached: _Cached) -> None:
        self._local.cached = None
        with self._lock:
            if self._open.get(threading.get_ident()) is cached:
                del self._open[threading.get_ident()]
        _close(cached, loop_too=False)  # the calling thread's own: close() takes its loop along


def drop_stray_replies(ipr: IPRoute) -> None:
    """Empty the queue where pyroute2 parks replies no request waits for (between requests).

    A successful ``link("get")`` is answered with the link and then an ACK; pyroute2 returns
    after the link and files the late ACK under "no request" (36 bytes a call). In a session
    that lives as long as the daemon, those would pile up without end.
    """
    root = getattr(getattr(ipr.asyncore.local, "msg_queue", None), "root", None)
    while root is not None and not root.empty():
        root.get_nowait()
        root.task_done()


def _close(cached: _Cached, loop_too: bool) -> None:
    """Close a session; ``loop_too`` for a session whose thread has ended (or the loop stays)."""
    try:
        if loop_too and not cached.loop.is_closed():
            cached.transport.abort()  # lets the loop drop the socket on its next turn
            cached.loop.run_until_complete(asyncio.sleep(0))
        cached.ipr.close()
        if loop_too and not cached.loop.is_closed():
            cached.loop.close()
    except Exception:  # closing must never fail a request or the shutdown
        log.debug("closing a netlink session failed", exc_info=True)


_NODE = NodeSessions()


def node_session() -> AbstractContextManager[IPRoute]:
    """The calling thread's IPRoute in its own netns (pycnid's node netns), reused."""
    return _NODE.session()


def close_node_sessions() -> None:
    _NODE.close_all()


@contextmanager
def pod_session(
    netns_fd: int, inside: Callable[[], T] | None = None
) -> Iterator[tuple[IPRoute, T | None]]:
    """An IPRoute bound to the pod netns; ``inside()`` runs in the pod, its value is returned."""
    with entered(netns_fd):
        ipr = IPRoute()
        try:
            value = inside() if inside else None
        except BaseException:
            ipr.close()
            raise
    try:
        yield ipr, value
    finally:
        ipr.close()

"""pyroute2 sessions bound to one netns, owned by one request thread.

pyroute2 0.9 keeps its netlink socket per thread (thread-local, created on first use in the
calling thread's netns), so an ``IPRoute`` is never shared between threads or pooled: each
request opens its own, uses it on its own thread and closes it. A pod session is created
while the thread is inside the pod netns (``entered``), so its socket stays bound there after
the thread returns home; work that must run inside the pod (sysctls, ioctls) goes in
``inside``. Never use pyroute2's ``netns=`` argument: it creates missing namespaces.
"""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

from pyroute2 import IPRoute

from .ns import entered

T = TypeVar("T")
# pyroute2 logs every netlink message at DEBUG (a dict repr each): with pycnid at debug level
# that floods the log and costs more than the request itself.
logging.getLogger("pyroute2").setLevel(logging.INFO)


@contextmanager
def node_session() -> Iterator[IPRoute]:
    """An IPRoute in the calling thread's own netns (pycnid's node netns)."""
    ipr = IPRoute()
    try:
        yield ipr
    finally:
        ipr.close()


@contextmanager
def pod_session(netns_fd: int, inside: Callable[[], T] | None = None
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


def thread_netns_inode() -> int:
    """The inode of the calling thread's netns (to tell the node netns from a pod's)."""
    return os.stat("/proc/thread-self/ns/net").st_ino

"""Network namespaces by fd, switched per thread.

``setns(2)`` moves only the calling thread, so a worker thread may enter a pod's netns, open a
netlink socket there (the socket stays bound to that netns) and come back. ``entered`` always
switches back in ``finally``, so a switch never leaks into other work on the thread.
Never creates a namespace: a vanished CNI_NETNS is an error (cf. pyroute2's O_CREAT default).

A thread's netns is known without a syscall (``thread_netns_inode``) between its own switches:
only its own ``setns`` (here, pycni's one way to switch) moves it, and a new thread starts with
nothing known.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from cni.spec.errors import InvalidEnvironment

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


_known = threading.local()  # the calling thread's netns inode, until its own next setns


def setns(fd: int, nstype: int = CLONE_NEWNET) -> None:
    _known.inode = None
    if _libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def thread_netns_inode() -> int:
    """The inode of the calling thread's netns (to tell the node netns from a pod's), read
    once between the thread's own switches (``setns``): every nft call and node session asks,
    and a stat of /proc/thread-self/ns/net took 30-60 us after an idle spell (5 us back to
    back), in a NetworkPolicy pass of ~2 ms and in each ADD's isolation."""
    inode = getattr(_known, "inode", None)
    if inode is None:
        inode = _known.inode = os.stat("/proc/thread-self/ns/net").st_ino
    return inode


def current_netns_fd() -> int:
    """An fd for the calling thread's current netns."""
    return os.open(f"/proc/self/task/{_gettid()}/ns/net", os.O_RDONLY | os.O_CLOEXEC)


def _gettid() -> int:
    return ctypes.CDLL(None).syscall(186) if not hasattr(os, "gettid") else os.gettid()


@contextmanager
def entered(fd: int) -> Iterator[None]:
    """Run the body with the calling thread inside the netns ``fd``."""
    home = current_netns_fd()
    try:
        try:
            setns(fd)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise InvalidEnvironment(
                    "CNI_NETNS is not a network namespace", "setns() refused the file"
                ) from None
            raise
        try:
            yield
        finally:
            setns(home)
    finally:
        os.close(home)


NS_GET_NSTYPE = 0xB703


def validate_netns_fd(fd: int, path: str = "CNI_NETNS") -> None:
    """Raise code 4 unless ``fd`` is a network namespace (ioctl NS_GET_NSTYPE)."""
    import fcntl

    try:
        kind = fcntl.ioctl(fd, NS_GET_NSTYPE)
    except OSError as exc:
        raise InvalidEnvironment(
            "CNI_NETNS is not a network namespace", f"{path!r}: {exc.strerror}"
        ) from None
    if kind != CLONE_NEWNET:
        raise InvalidEnvironment(
            "CNI_NETNS is not a network namespace", f"{path!r} is a namespace of another type"
        )


def same_netns(fd_a: int, fd_b: int) -> bool:
    a, b = os.fstat(fd_a), os.fstat(fd_b)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def open_netns_path(path: str) -> int:
    """Open an existing netns path (O_RDONLY, never O_CREAT)."""
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)

"""Turning mechanism failures (netlink, sysctl, nft) into CNI errors that say what failed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyroute2.netlink.exceptions import NetlinkError

from cni.spec.errors import CNIError, NodeChangeFailed
from kernel.link import LinkError
from kernel.nft import NftError

MECHANISM_ERRORS = (NetlinkError, OSError, NftError, LinkError)


@contextmanager
def failing(what: str) -> Iterator[None]:
    """Re-raise a mechanism error as ``NodeChangeFailed(what, cause)`` (code 104: the kernel
    refused, not a bug in pycni); CNI errors pass unchanged."""
    try:
        yield
    except CNIError:
        raise
    except MECHANISM_ERRORS as exc:
        raise NodeChangeFailed(what, describe(exc)) from exc


def describe(exc: BaseException) -> str:
    if isinstance(exc, NetlinkError):
        return f"netlink error {exc.code}: {exc.args[1] if len(exc.args) > 1 else exc}"
    return str(exc)

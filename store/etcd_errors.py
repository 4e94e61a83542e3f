"""etcd's gRPC errors in pycni's words: which another member may fix (``RETRYABLE``), which a
new auth token may fix (``stale``), and the CNI error for the rest (``translate_rpc_error``):
a refused password, permission or token is code 7 (InvalidConfig, naming the user and what it
was refused), an exhausted or overloaded cluster code 11, anything else code 999."""

from __future__ import annotations

import grpc

from cni.spec.errors import CNIError, InternalError, InvalidConfig, TryAgainLater
from store.etcd_auth import is_stale_token
from store.keys import ROLE_RANGE

#: gRPC codes after which another member may succeed (a member without quorum answers
#: UNKNOWN "context deadline exceeded" to a linearizable read).
RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
    }
)


REFUSED = "TLS refused by "  # how ``diagnose`` marks a refusal it named


def stale(exc: grpc.RpcError, token: str | None) -> bool:
    """A refusal a new token may fix: etcd forgot the token, or pycnid has none because the
    cluster had authentication disabled when it asked, and has enabled it since."""
    return is_stale_token(exc) or (token == "" and exc.code() == grpc.StatusCode.PERMISSION_DENIED)


def describe_rpc_error(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code else 'ERROR'} {details}"


def translate_rpc_error(
    exc: grpc.RpcError, label: str, what: str, user: str = "pycnid"
) -> CNIError:
    """A gRPC error no other member can fix, as the CNI error that says what to do."""
    code, detail = exc.code(), describe_rpc_error(exc)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return InvalidConfig(
            f"etcd at {label}: permission denied to {user} for the {what}"
            f" (its role needs readwrite on {ROLE_RANGE})",
            detail,
        )
    if "user name is empty" in detail:
        return InvalidConfig(
            f"etcd at {label} requires user authentication for the {what}:"
            " set store.username and store.passwordFile",
            detail,
        )
    if code == grpc.StatusCode.UNAUTHENTICATED or is_stale_token(exc):
        return InvalidConfig(f"etcd at {label} refused the credentials of {user}", detail)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return TryAgainLater(f"etcd at {label} is out of space or overloaded", detail)
    if code in RETRYABLE:
        return TryAgainLater(f"etcd at {label} is unreachable ({what} not served)", detail)
    return InternalError(f"etcd at {label} rejected the {what}", detail)

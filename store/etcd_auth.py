"""etcd user authentication: a token from ``Auth.Authenticate``, sent as the ``token`` metadata of
every call (unary and streams alike: KV, Lease, Watch, Maintenance), renewed when etcd refuses it.

pyetcd's ``MultiEndpointEtcd3Client(user=, password=)`` authenticates once, in its constructor,
against one member chosen at random, without a timeout budget across members, and never again;
its token dies with the member that issued it (simple tokens live in memory) or after
``--auth-token-ttl`` idle seconds, and the client then fails every call. So pycnid keeps its own:
``Credentials`` authenticates on the member a call is about to use, when it holds no token, and
forgets the token etcd refused (``etcdserver: invalid auth token``, or ``revision of auth store is
old`` after a role change), so the caller authenticates again and retries; the etcd Go client
does the same. A token is valid on every member (etcd replicates simple tokens through raft; JWTs
are signed), so a failover needs a new one only when etcd says so.

The password lives in a file (``store.passwordFile``), never in the config, a command line, a log
line or a metric. The file is read at open and again at every authentication (a rotated Secret
is picked up), and refused when group or others may access it (as ssh does a private key): a
Kubernetes Secret volume needs ``defaultMode: 0400``. One trailing newline (``\n`` or ``\r\n``)
is dropped (``echo pw > file``); every other character is the password's.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections import namedtuple
from typing import Any

import grpc
from pyetcd import etcdrpc

from cni.spec.errors import InvalidConfig

log = logging.getLogger("pycnid.store.etcd")

PASSWORD_KEY = "store.passwordFile"
MAX_PASSWORD = 4096  # bytes; etcd's own limit is the request size

#: etcd answers after which a new token may succeed: (gRPC code, text in the details).
STALE_TOKEN = (
    (grpc.StatusCode.UNAUTHENTICATED, "invalid auth token"),
    (grpc.StatusCode.INVALID_ARGUMENT, "revision of auth store is old"),
    (grpc.StatusCode.INVALID_ARGUMENT, "user name is empty"),
)


class AuthFailed(InvalidConfig):
    """etcd refused the user name or password (code 7: a retry cannot fix it)."""


def read_password(path: str) -> str:
    """The password in ``path``, refused (code 7 naming ``store.passwordFile``) when the file
    is missing, empty, not UTF-8, too long, or open to group or others."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise bad_password_file(f"cannot read {path}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise bad_password_file(f"{path} is not a regular file")
        if mode & 0o077:
            raise bad_password_file(
                f"{path} may be read by group or others (mode {stat.S_IMODE(mode):04o}):"
                " chmod 0600 it (a Kubernetes Secret volume: defaultMode: 0400)"
            )
        raw = os.read(fd, MAX_PASSWORD + 1)
    finally:
        os.close(fd)
    return decode_password(path, raw)


def decode_password(path: str, raw: bytes) -> str:
    if len(raw) > MAX_PASSWORD:
        raise bad_password_file(f"{path} is longer than {MAX_PASSWORD} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise bad_password_file(f"{path} is not UTF-8 text") from None
    password = text.removesuffix("\r\n") if text.endswith("\r\n") else text.removesuffix("\n")
    if not password:
        raise bad_password_file(f"{path} is empty")
    return password


def bad_password_file(details: str) -> InvalidConfig:
    return InvalidConfig(f"invalid daemon config key '{PASSWORD_KEY}'", details)


def is_stale_token(exc: grpc.RpcError) -> bool:
    """etcd refused the token a call carried, not the user: authenticate again."""
    code, details = exc.code(), exc.details() or ""
    return any(code == c and text in details for c, text in STALE_TOKEN)


class Credentials:
    """The user pycnid authenticates as and its current token (thread-safe).

    ``token`` is None until authenticated (and after ``refused``), "" when the cluster has
    authentication disabled (calls then go without a token; pycnid logs it once)."""

    def __init__(self, username: str, password_file: str, label: str) -> None:
        self.username, self.password_file, self.label = username, password_file, label
        self.authentications = 0
        self._token: str | None = None
        self._lock = threading.Lock()
        read_password(password_file)  # a bad file is a config error at open, not at first use

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password_file={self.password_file!r})"

    @property
    def token(self) -> str | None:
        return self._token

    def ensure(self, stub: etcdrpc.AuthStub, timeout: float) -> str | None:
        """The token to send, authenticating on ``stub``'s member first when there is none.
        A gRPC error other than a refused password propagates (the caller fails over)."""
        with self._lock:
            if self._token is None:
                self._token = self.authenticate(stub, timeout)
            return self._token

    def refused(self, token: str | None) -> None:
        """etcd refused ``token``: the next ``ensure`` authenticates again (once, even when
        several calls saw the same token refused)."""
        with self._lock:
            if self._token == token:
                self._token = None

    def authenticate(self, stub: etcdrpc.AuthStub, timeout: float) -> str:
        request = etcdrpc.AuthenticateRequest(
            name=self.username, password=read_password(self.password_file)
        )
        try:
            token = stub.Authenticate(request, timeout).token
        except grpc.RpcError as exc:
            return self.on_refusal(exc)
        self.authentications += 1
        log.debug("etcd at %s: authenticated as user %r", self.label, self.username)
        return token

    def on_refusal(self, exc: grpc.RpcError) -> str:
        details = exc.details() or ""
        if exc.code() == grpc.StatusCode.FAILED_PRECONDITION and "not enabled" in details:
            log.warning(
                "etcd at %s has authentication disabled: store.username %r is not used",
                self.label,
                self.username,
            )
            return ""
        if exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "authentication failed" in details:
            raise AuthFailed(
                f"etcd at {self.label}: authentication failed for user {self.username!r}"
                f" (check store.username and the password in store.passwordFile"
                f" {self.password_file})",
                details.removeprefix("etcdserver: "),
            ) from None
        raise exc


_CallDetails = namedtuple(
    "_CallDetails",
    ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
)


class CallDetails(_CallDetails, grpc.ClientCallDetails):
    pass


class TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds ``("token", <current token>)`` to every call's metadata (none while there is none)."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials

    def with_token(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        token = self.credentials.token
        if not token:
            return details
        metadata = [*(details.metadata or ()), ("token", token)]
        return CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self.with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self.with_token(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self.with_token(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self.with_token(details), requests)

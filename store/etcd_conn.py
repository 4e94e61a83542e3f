"""One connection to an etcd cluster: every endpoint, fast failover, short deadlines, mTLS,
user authentication.

Built on etcd-sdk-python (``pyetcd``): its ``Endpoint`` (one gRPC channel per member, failure
tracking with ``time_retry``) and ``MultiEndpointEtcd3Client`` (use the current member, else the
next one not recently failed), plus the generated stubs in ``pyetcd.etcdrpc``. What pyetcd does
not give lives here: a per-call timeout *and* an overall deadline across
members, a short ``time_retry`` (its default keeps a member "failed" for 300 s), gRPC reconnect
backoff capped at 1 s (gRPC's default grows to 120 s), a token that is renewed when etcd refuses
it (``etcd_auth``), and every gRPC error turned into a CNI error naming the endpoints: a refused
password, permission or certificate (``etcd_tls`` names which) is code 7, since retrying cannot
fix it; a member that does not answer is code 11.

A retried write is safe because every pycni write compares revisions: if the first attempt was
applied before its member died, the retry's compares fail and the caller re-reads, exactly as
after any conflict.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import grpc
from pyetcd import Endpoint, MultiEndpointEtcd3Client, etcdrpc
from pyetcd.exceptions import NoServerAvailableError

from cni.spec.errors import CNIError, InvalidConfig, TryAgainLater
from store.deadline import bound
from store.etcd_auth import Credentials, TokenInterceptor
from store.etcd_errors import (
    REFUSED,
    RETRYABLE,
    describe_rpc_error,
    stale,
    translate_rpc_error,
)
from store.etcd_tls import check_files, diagnose_handshake, may_be_handshake

T = TypeVar("T")
log = logging.getLogger("pycnid.store.etcd")

CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),  # etcd refuses pings more often than every 5 s
    ("grpc.keepalive_timeout_ms", 5_000),  # a frozen member's watch stream ends in ~15 s
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
]


@dataclass(frozen=True)
class EtcdOptions:
    """The etcd part of pycnid's config; timeouts in seconds."""

    endpoints: tuple[str, ...]
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    call_timeout: float = 1.0  # one RPC on one member
    request_timeout: float = 2.5  # one store call, across members and retries
    status_timeout: float = 0.8  # STATUS must answer fast
    endpoint_retry: float = 1.0  # a failed member is skipped this long
    server_name: str | None = None  # TLS name to verify instead of the endpoint's host
    username: str | None = None  # etcd user authentication, with the password in a file
    password_file: str | None = None


OPTION_KEYS = {
    "callTimeout": "call_timeout",
    "requestTimeout": "request_timeout",
    "statusTimeout": "status_timeout",
    "endpointRetry": "endpoint_retry",
}


def parse_options(
    endpoints: Sequence[str],
    ca: str | None,
    cert: str | None,
    key: str | None,
    extra: Mapping[str, Any] | None,
    username: str | None = None,
    password_file: str | None = None,
) -> EtcdOptions:
    """Validate the daemon config's etcd settings (InvalidConfig naming the bad key)."""
    timeouts = {
        attr: validate_seconds(name, (extra or {})[name])
        for name, attr in OPTION_KEYS.items()
        if name in (extra or {})
    }
    server_name = (extra or {}).get("tlsServerName")
    opts = EtcdOptions(
        tuple(endpoints),
        ca,
        cert,
        key,
        server_name=server_name,
        username=username,
        password_file=password_file,
        **timeouts,
    )
    validate_endpoints(opts)
    validate_user(opts)
    return opts


def validate_seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 60:
        raise InvalidConfig(
            f"invalid daemon config key 'store.{name}'",
            f"expected seconds between 0 and 60, got {value!r}",
        )
    return float(value)


def validate_endpoints(opts: EtcdOptions) -> None:
    if not opts.endpoints:
        raise InvalidConfig(
            "invalid daemon config key 'store.endpoints'",
            "an etcd store needs at least one endpoint",
        )
    schemes = {parse_endpoint(url)[0] for url in opts.endpoints}
    if len(schemes) > 1:
        raise InvalidConfig(
            "invalid daemon config key 'store.endpoints'", "mixes http:// and https:// endpoints"
        )
    if bool(opts.cert) != bool(opts.key):
        raise InvalidConfig(
            "invalid daemon config key 'store.cert'",
            "a client certificate needs both 'cert' and 'key'",
        )
    if schemes == {"http"} and (opts.ca or opts.cert):
        raise InvalidConfig(
            "invalid daemon config key 'store.endpoints'",
            "TLS files are set but the endpoints are http://, use https://",
        )


def validate_user(opts: EtcdOptions) -> None:
    if bool(opts.username) != bool(opts.password_file):
        missing = "passwordFile" if opts.username else "username"
        raise InvalidConfig(
            f"invalid daemon config key 'store.{missing}'",
            "etcd user authentication needs both 'username' and 'passwordFile'",
        )


def parse_endpoint(url: str) -> tuple[str, str, int]:
    """``"https://10.0.0.1:2379"`` -> ``("https", "10.0.0.1", 2379)`` (IPv6 kept in brackets)."""
    parts = urlsplit(str(url))
    try:
        port = parts.port or 2379
    except ValueError:
        port = -1
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or port <= 0
        or parts.path not in ("", "/")
    ):
        raise InvalidConfig(
            "invalid daemon config key 'store.endpoints'", f"{url!r} is not http(s)://host:port"
        )
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return parts.scheme, host, port


def read_file(what: str, path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise InvalidConfig(
            f"invalid daemon config key 'store.{what}'", f"cannot read {path}: {exc.strerror}"
        ) from None


def build_credentials(opts: EtcdOptions) -> grpc.ChannelCredentials:
    ca, key, cert = (
        read_file("ca", opts.ca),
        read_file("key", opts.key),
        read_file("cert", opts.cert),
    )
    check_files(opts)  # they parse, and the key is the certificate's
    return grpc.ssl_channel_credentials(ca, key, cert)


def build_endpoints(opts: EtcdOptions) -> list[Endpoint]:
    secure = parse_endpoint(opts.endpoints[0])[0] == "https"
    creds = build_credentials(opts) if secure else None
    channel_opts: list[tuple[str, int | str]] = list(CHANNEL_OPTIONS)
    if opts.server_name:
        channel_opts.append(("grpc.ssl_target_name_override", opts.server_name))
    endpoints = []
    for url in opts.endpoints:
        _, host, port = parse_endpoint(url)
        endpoints.append(
            Endpoint(
                host,
                port,
                secure=secure,
                creds=creds,
                time_retry=opts.endpoint_retry,
                opts=channel_opts,
            )
        )
    return endpoints


class Stubs:
    """The gRPC stubs bound to one member's channel; with ``credentials`` every call but
    ``auth``'s carries the current token."""

    def __init__(self, channel: grpc.Channel, credentials: Credentials | None = None) -> None:
        self.auth = etcdrpc.AuthStub(channel)
        if credentials is not None:
            channel = grpc.intercept_channel(channel, TokenInterceptor(credentials))
        self.kv = etcdrpc.KVStub(channel)
        self.lease = etcdrpc.LeaseStub(channel)
        self.maintenance = etcdrpc.MaintenanceStub(channel)
        self.watch = etcdrpc.WatchStub(channel)


class Connection:
    """Runs RPCs against the cluster with failover and a deadline; errors come out as CNI ones."""

    def __init__(self, opts: EtcdOptions) -> None:
        self.opts = opts
        self.label = ",".join(opts.endpoints)
        self.credentials = (
            Credentials(opts.username, opts.password_file, self.label)
            if opts.username and opts.password_file
            else None
        )
        self._client = MultiEndpointEtcd3Client(build_endpoints(opts), failover=True)
        self._stubs: dict[str, Stubs] = {}
        self._lock = threading.Lock()
        self._closed = False

    def pick(self) -> tuple[Endpoint, Stubs]:
        """The member to use now (raises NoServerAvailableError when all failed recently)."""
        with self._lock:
            if self._closed:
                raise TryAgainLater(f"etcd store {self.label} is closed")
            channel = self._client.channel
            endpoint = self._client.endpoint_in_use
            stubs = self._stubs.get(endpoint.netloc)
            if stubs is None:
                stubs = self._stubs[endpoint.netloc] = Stubs(channel, self.credentials)
            return endpoint, stubs

    def authorize(self, stubs: Stubs, timeout: float) -> str | None:
        """The token the next call on ``stubs`` carries (authenticating on its member first
        when there is none); None without a user."""
        if self.credentials is None:
            return None
        return self.credentials.ensure(stubs.auth, timeout)

    def refused(self, token: str | None) -> None:
        """etcd refused ``token``: the next call authenticates again."""
        if self.credentials is not None:
            self.credentials.refused(token)

    def call(
        self, rpc: Callable[[Stubs, float], T], budget: float | None = None, what: str = "request"
    ) -> T:
        """``rpc(stubs, timeout)`` on a healthy member, failing over until ``budget`` is spent;
        a refused token is renewed once per call."""
        # a CNI request's cap on each store call (store.deadline), if any
        deadline = time.monotonic() + bound(budget or self.opts.request_timeout)
        attempts = Attempts()
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                endpoint, stubs = self.pick()
            except NoServerAvailableError:
                time.sleep(min(self.wait_for_retry(), remaining))
                continue
            timeout, token = min(self.opts.call_timeout, remaining), None
            try:
                token = self.authorize(stubs, timeout)
                return rpc(stubs, timeout)
            except grpc.RpcError as exc:
                self.on_rpc_error(exc, endpoint, token, what, attempts)
            except ValueError as exc:  # gRPC refuses calls on a channel closed under us
                attempts.last_error = f"{endpoint.netloc}: {exc}"
                if self._closed:
                    raise TryAgainLater(f"etcd store {self.label} is closed") from None
                endpoint.fail()
        raise self.exhausted(attempts.last_error, what)

    def on_rpc_error(
        self,
        exc: grpc.RpcError,
        endpoint: Endpoint,
        token: str | None,
        what: str,
        attempts: Attempts,
    ) -> None:
        """Renew a refused token, raise what no member can fix, or fail the member over."""
        attempts.last_error = f"{endpoint.netloc}: {describe_rpc_error(exc)}"
        if self.credentials is not None and not attempts.renewed and stale(exc, token):
            log.info("etcd at %s refused pycnid's token; authenticating again", self.label)
            self.refused(token)
            attempts.renewed = True  # once per call: a second refusal is the answer
            return
        if exc.code() not in RETRYABLE:
            raise translate_rpc_error(exc, self.label, what, self.user) from None
        log.debug("etcd %s failed, trying another member: %s", what, attempts.last_error)
        if endpoint.secure and may_be_handshake(attempts.last_error):
            attempts.last_error = self.diagnose(endpoint, attempts.last_error)
        endpoint.fail()

    def exhausted(self, last_error: str, what: str) -> CNIError:
        """No member served the call: code 7 when the last one refused pycnid's certificate
        (``diagnose``), else code 11."""
        if last_error.startswith(REFUSED):
            return InvalidConfig(
                f"etcd at {self.label}: TLS handshake refused ({what} not served)",
                last_error.removeprefix(REFUSED),
            )
        return TryAgainLater(
            f"etcd at {self.label} is unreachable or without quorum ({what} not served)",
            last_error,
        )

    @property
    def user(self) -> str:
        """Who etcd sees: the user, else the client certificate's name."""
        if self.credentials is not None:
            return f"user {self.credentials.username!r}"
        return "pycnid (no store.username)"

    def diagnose(self, endpoint: Endpoint, error: str) -> str:
        """``error``, or why the member refused pycnid's TLS credentials (``REFUSED`` ...)."""
        _, host, port = parse_endpoint(f"https://{endpoint.netloc}")
        why = diagnose_handshake(self.opts, host, port, self.opts.call_timeout)
        return f"{REFUSED}{endpoint.netloc}: {why}" if why else error

    def wait_for_retry(self) -> float:
        """Seconds until the first failed member may be tried again (at least 10 ms)."""
        now = time.time()
        waits = [ep.last_failed + ep.time_retry - now for ep in self._client.endpoints.values()]
        return max(0.01, min(waits, default=0.01))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for endpoint in self._client.endpoints.values():
            endpoint.close()


@dataclass
class Attempts:
    """One call's tries so far: the last error seen, whether its token was renewed."""

    last_error: str = "no member answered"
    renewed: bool = False

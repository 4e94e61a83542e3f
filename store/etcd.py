"""The Store on etcd v3 (etcd-sdk-python behind our own adapter: ``etcd_conn``).

Reads are linearizable ranges; every write is one ``Txn`` whose compares are ``mod_revision ==
r`` per key read, or ``version == 0`` (create-if-absent) for ``Compare(key, 0)``. Calls fail over
between all endpoints and end within ``requestTimeout`` (default 2.5 s) with ``TryAgainLater``
(code 11) naming the endpoints when no member answers; ``status()`` answers ``NotAvailable``
(code 50) within ``statusTimeout`` (default 0.8 s). Beyond the Store protocol: leases with a
keepalive loop (``keep_lease``), resumable watches (``watch``) and ``compact``.

Daemon config: ``{"type": "etcd", "endpoints": ["https://10.0.0.1:2379", ...], "ca": ..., "cert":
..., "key": ..., "callTimeout": 1.0, "requestTimeout": 2.5, "statusTimeout": 0.8,
"endpointRetry": 1.0, "tlsServerName": null, "username": ..., "passwordFile": ...}``. With a
``username`` every call carries an etcd auth token (``etcd_auth``); pycni's keys are all under
``/pycni/v1/``, so its role needs readwrite on that prefix and nothing else.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc
from pyetcd import etcdrpc

from cni.spec.errors import InternalError, InvalidConfig, NotAvailable, TryAgainLater
from store.base import KV, PREFIX, Compare, Delete, Op, Put, TxnResult
from store.etcd_conn import Connection, Stubs, parse_options
from store.etcd_lease import LeaseKeeper
from store.etcd_watch import Watch, WatchUpdate, calc_range, to_kv
from store.keys import ACCESS_PROBE, ROLE_RANGE

if TYPE_CHECKING:
    from store.config import StoreConfig

RANGE_PAGE = 1000  # keys a page of ``range_pages``


class EtcdStore:
    """``Store`` on an etcd cluster; ``name`` is ``"etcd:<endpoint>,<endpoint>..."``."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        ca: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        options: Mapping[str, Any] | None = None,
        username: str | None = None,
        password_file: str | None = None,
    ) -> None:
        self.options = parse_options(endpoints, ca, cert, key, options, username, password_file)
        self.conn = Connection(self.options)
        self.name = f"etcd:{self.conn.label}"
        self._lock = threading.Lock()
        self._keepers: list[LeaseKeeper] = []
        self._watches: list[Watch] = []

    @classmethod
    def from_config(cls, config: StoreConfig) -> EtcdStore:
        return cls(
            config.endpoints,
            ca=config.ca,
            cert=config.cert,
            key=config.key,
            options=config.options,
            username=config.username,
            password_file=config.password_file,
        )

    # -- the Store protocol -------------------------------------------------------------------

    def get(self, key: str) -> KV | None:
        request = etcdrpc.RangeRequest(key=key.encode())
        response = self.conn.call(lambda s, t: s.kv.Range(request, t), what=f"get {key}")
        return to_kv(response.kvs[0]) if response.kvs else None

    def range(self, prefix: str, *, keys_only: bool = False, limit: int = 0) -> list[KV]:
        return self.range_at(prefix, keys_only=keys_only, limit=limit)[0]

    def range_at(
        self, prefix: str, *, keys_only: bool = False, limit: int = 0
    ) -> tuple[list[KV], int]:
        """``range`` plus the revision it was read at (one consistent snapshot)."""
        key, range_end = calc_range(prefix)
        request = etcdrpc.RangeRequest(
            key=key, range_end=range_end, keys_only=keys_only, limit=limit
        )
        response = self.conn.call(lambda s, t: s.kv.Range(request, t), what=f"range {prefix}")
        return [to_kv(kv) for kv in response.kvs], response.header.revision

    def range_pages(self, prefix: str, page: int = RANGE_PAGE) -> tuple[Iterator[KV], int]:
        """``range_at`` a page of ``page`` keys at a time, every page read at the first one's
        revision (one consistent snapshot): the next page is fetched when the caller has
        consumed this one, so a large prefix is never held whole, neither as the response
        nor as KVs (at 10k Services x 5 endpoints that was ~60 MiB at a restart)."""
        key, range_end = calc_range(prefix)
        first = self._range_page(prefix, key, range_end, page, 0)
        revision = first.header.revision
        return self._pages(prefix, first, range_end, page, revision), revision

    def _pages(
        self, prefix: str, response: Any, range_end: bytes, page: int, revision: int
    ) -> Iterator[KV]:
        while True:
            yield from map(to_kv, response.kvs)
            if not response.more or not response.kvs:
                return
            after = response.kvs[-1].key + b"\0"
            response = None  # this page is freed before the next is read
            response = self._range_page(prefix, after, range_end, page, revision)

    def _range_page(
        self, prefix: str, key: bytes, range_end: bytes, page: int, revision: int
    ) -> Any:
        request = etcdrpc.RangeRequest(key=key, range_end=range_end, limit=page, revision=revision)
        return self.conn.call(lambda s, t: s.kv.Range(request, t), what=f"range {prefix}")

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        request = etcdrpc.TxnRequest(
            compare=[render_compare(c) for c in compares], success=[render_op(op) for op in ops]
        )
        what = describe_txn(compares, ops)
        response = self.conn.call(lambda s, t: s.kv.Txn(request, t), what=what)
        return TxnResult(response.succeeded, response.header.revision)

    def revision(self) -> int:
        # one key of pycni's own: a role limited to pycni's prefix may read it
        request = etcdrpc.RangeRequest(key=PREFIX.encode(), count_only=True)
        return self.conn.call(lambda s, t: s.kv.Range(request, t), what="revision").header.revision

    def status(self) -> None:
        """NotAvailable unless a quorum answers now and no alarm (e.g. NOSPACE) blocks writes.

        An alarm GET goes through raft, so an answer proves a leader and a quorum."""
        request = etcdrpc.AlarmRequest(action=etcdrpc.AlarmRequest.GET)
        try:
            response = self.conn.call(
                lambda s, t: s.maintenance.Alarm(request, t),
                budget=self.options.status_timeout,
                what="status",
            )
        except TryAgainLater as exc:
            raise NotAvailable(f"etcd at {self.conn.label} is unreachable", exc.details) from None
        except InvalidConfig as exc:  # refused credentials: not ready either, and why
            raise NotAvailable(exc.msg, exc.details) from None
        if response.alarms:
            names = sorted({etcdrpc.AlarmType.Name(a.alarm) for a in response.alarms})
            raise NotAvailable(
                f"etcd at {self.conn.label} refuses writes: alarm " + ",".join(names)
            )

    def close(self) -> None:
        """Stop watches and lease keepers (revoking their leases), then close the channels."""
        with self._lock:
            watches, keepers = self._watches, self._keepers
            self._watches, self._keepers = [], []
        for watch in watches:
            watch.cancel()
        for keeper in keepers:
            keeper.stop(revoke=True)
        self.conn.close()

    def check_access(self) -> None:
        """pycnid's start-up check: the credentials authenticate and may read and write
        pycni's prefix (InvalidConfig naming the refusal; TryAgainLater when no member answers).

        One txn whose compare never holds (a version is never below 0), so its put is never
        applied but etcd checks the permission for it all the same."""
        key = ACCESS_PROBE.encode()
        never = etcdrpc.Compare(
            key=key, target=etcdrpc.Compare.VERSION, result=etcdrpc.Compare.LESS, version=0
        )
        write = etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=b""))
        request = etcdrpc.TxnRequest(compare=[never], success=[write])
        self.conn.call(lambda s, t: s.kv.Txn(request, t), what=f"write under {ROLE_RANGE}")

    # -- beyond the protocol: compaction, leases, watches -------------------------------------

    def compact(self, revision: int) -> None:
        request = etcdrpc.CompactionRequest(revision=revision, physical=True)
        self.conn.call(lambda s, t: s.kv.Compact(request, t), what="compact")

    def grant_lease(self, ttl: int) -> int:
        request = etcdrpc.LeaseGrantRequest(TTL=int(ttl))
        response = self.conn.call(lambda s, t: s.lease.LeaseGrant(request, t), what="lease grant")
        if response.error:
            raise InternalError(f"etcd at {self.conn.label} refused a lease", response.error)
        return response.ID

    def refresh_lease(self, lease_id: int) -> int:
        """Renew the lease once; returns its new TTL, 0 when it no longer exists."""
        return self.conn.call(lambda s, t: keepalive_once(s, t, lease_id), what="lease refresh")

    def lease_ttl(self, lease_id: int) -> int:
        """Seconds left on the lease; -1 when it does not exist."""
        request = etcdrpc.LeaseTimeToLiveRequest(ID=lease_id)
        return self.conn.call(
            lambda s, t: s.lease.LeaseTimeToLive(request, t), what="lease ttl"
        ).TTL

    def revoke_lease(self, lease_id: int) -> None:
        """Revoke the lease (its keys vanish); a lease already gone is fine."""
        self.conn.call(lambda s, t: revoke_once(s, t, lease_id), what="lease revoke")

    def keep_lease(self, ttl: int, on_grant: Callable[[int], None] | None = None) -> LeaseKeeper:
        """A lease kept alive by a background thread until ``close()``; ``on_grant(lease_id)``
        runs after every (re-)grant to (re-)write the keys attached to it."""
        keeper = LeaseKeeper(self, ttl, on_grant)
        with self._lock:
            self._keepers.append(keeper)
        return keeper.start()

    def watch(
        self, prefix: str, start_revision: int, callback: Callable[[WatchUpdate], None]
    ) -> Watch:
        """Deliver every change under ``prefix`` from ``start_revision`` (0 = from now) to
        ``callback``, across member failures; a snapshot when the history was compacted."""
        watch = Watch(self.conn, self, prefix, start_revision, callback)
        with self._lock:
            self._watches.append(watch)
        return watch.start()


def describe_txn(compares: Sequence[Compare], ops: Sequence[Op]) -> str:
    """``txn writing /pycni/v1/blocks/p/10.0.0.0-26 (+2 more keys)``: what a refusal names."""
    keys = [op.key for op in ops] or [c.key for c in compares]
    verb = "writing" if ops else "reading"
    if not keys:
        return "txn"
    more = f" (+{len(keys) - 1} more keys)" if len(keys) > 1 else ""
    return f"txn {verb} {keys[0]}{more}"


def render_compare(compare: Compare) -> etcdrpc.Compare:
    key = compare.key.encode()
    if compare.mod_revision == 0:
        return etcdrpc.Compare(
            key=key, target=etcdrpc.Compare.VERSION, result=etcdrpc.Compare.EQUAL, version=0
        )
    return etcdrpc.Compare(
        key=key,
        target=etcdrpc.Compare.MOD,
        result=etcdrpc.Compare.EQUAL,
        mod_revision=compare.mod_revision,
    )


def render_op(op: Op) -> etcdrpc.RequestOp:
    if isinstance(op, Put):
        return etcdrpc.RequestOp(
            request_put=etcdrpc.PutRequest(
                key=op.key.encode(), value=bytes(op.value), lease=op.lease
            )
        )
    if isinstance(op, Delete):
        key, range_end = calc_range(op.key) if op.prefix else (op.key.encode(), b"")
        return etcdrpc.RequestOp(
            request_delete_range=etcdrpc.DeleteRangeRequest(key=key, range_end=range_end)
        )
    raise InternalError(f"unknown store op {op!r}")


def keepalive_once(stubs: Stubs, timeout: float, lease_id: int) -> int:
    call = stubs.lease.LeaseKeepAlive(iter([etcdrpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout)
    try:
        return next(iter(call)).TTL
    except StopIteration:
        return 0
    finally:
        call.cancel()


def revoke_once(stubs: Stubs, timeout: float, lease_id: int) -> None:
    try:
        stubs.lease.LeaseRevoke(etcdrpc.LeaseRevokeRequest(ID=lease_id), timeout)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise

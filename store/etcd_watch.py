"""Watch a key prefix and never lose an event: resume from the last revision, re-list if compacted.

pyetcd's watcher raises on any stream error and is not resumed, so this runs its
own watch stream on the shared connection: after any error (member killed, no leader, network)
it re-creates the watch on a healthy member from ``last_revision + 1``; if that revision was
compacted meanwhile, it lists the whole prefix and hands the owner a snapshot instead. With etcd
user authentication the stream carries the connection's token; etcd checks it when the watch is
created and cancels a watch created with a token it no longer knows ("invalid auth token"): the
token is then forgotten, and the next stream authenticates again.

The callback runs on the watch thread, one ``WatchUpdate`` at a time, in revision order.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import grpc
from pyetcd import etcdrpc
from pyetcd.etcdrpc import kv_pb2
from pyetcd.exceptions import NoServerAvailableError

from cni.spec.errors import CNIError
from common.loop import Backoff, Errors, Loop
from store.base import KV, Store
from store.etcd_conn import Connection
from store.etcd_errors import RETRYABLE, describe_rpc_error

log = logging.getLogger("pycnid.store.etcd")

BACKOFF_MIN, BACKOFF_MAX = 0.1, 1.0
REQUIRE_LEADER = (
    ("hasleader", "true"),
)  # etcd cancels the watch when its member loses the leader


@dataclass(frozen=True)
class WatchEvent:
    kind: str  # "put" | "delete"
    kv: KV  # for a delete: the key and the deleting revision, value empty


@dataclass(frozen=True)
class WatchUpdate:
    """Events up to ``revision``; with ``snapshot`` the events are every key under the prefix
    (all "put") as of ``revision``: the owner replaces its view instead of applying them."""

    revision: int
    events: tuple[WatchEvent, ...]
    snapshot: bool = False


class Lister(Protocol):
    def range_at(self, prefix: str) -> tuple[list[KV], int]: ...


class WatchingStore(Store, Lister, Protocol):
    """A store that also reads a prefix with its revision and watches it (``EtcdStore``)."""

    def watch(
        self, prefix: str, start_revision: int, callback: Callable[[WatchUpdate], None]
    ) -> Watch: ...


class Compacted(Exception):
    pass


class TokenRefused(RuntimeError):
    """etcd canceled the watch for its token: authenticate again before the next stream."""


def calc_range(prefix: str) -> tuple[bytes, bytes]:
    """etcd's [key, range_end) for every key starting with ``prefix`` ("" = the whole space)."""
    if not prefix:
        return b"\0", b"\0"
    key = prefix.encode()
    end = bytearray(key)
    for i in reversed(range(len(end))):
        if end[i] < 0xFF:
            end[i] += 1
            return key, bytes(end[: i + 1])
    return key, b"\0"


def to_kv(kv: kv_pb2.KeyValue) -> KV:
    return KV(
        kv.key.decode("utf-8", "surrogateescape"),
        bytes(kv.value),
        kv.mod_revision,
        kv.create_revision,
    )


def to_event(event: kv_pb2.Event) -> WatchEvent:
    kind = "delete" if event.type == kv_pb2.Event.DELETE else "put"
    return WatchEvent(kind, to_kv(event.kv))


class Watch:
    """A resumable watch on ``prefix``; ``cancel()`` stops it. See the module docstring."""

    def __init__(
        self,
        conn: Connection,
        lister: Lister,
        prefix: str,
        start_revision: int,
        callback: Callable[[WatchUpdate], None],
    ) -> None:
        self.prefix = prefix
        self.next_revision = start_revision  # 0: from "now", fixed when the watch is created
        self.restarts = 0
        self.relists = 0
        self.endpoint = ""  # the member the stream is on now (host:port)
        self._conn, self._lister, self._callback = conn, lister, callback
        self._created = threading.Event()
        self._call_lock = threading.Lock()
        self._call: grpc.Call | None = None
        self._requests: queue.Queue | None = None
        self.backoff = Backoff(BACKOFF_MIN, BACKOFF_MAX)
        self.loop = Loop(
            f"etcd-watch {prefix}",
            self.step,
            retry=self.backoff.next,
            join_timeout=None,
            errors=Errors(
                log, f"watch {prefix}", expected=(Exception,), describe=self.describe_failure
            ),
        )

    @property
    def last_revision(self) -> int:
        return max(self.next_revision - 1, 0)

    def start(self) -> Watch:
        self.loop.start()
        return self

    def wait_created(self, timeout: float) -> bool:
        """True once the watch stream is established (useful before writing in tests)."""
        return self._created.wait(timeout)

    def cancel(self) -> None:
        self.loop.stop(wait=False)
        self._end_stream()  # the stream ends: the step returns
        self.loop.join()  # a cancel from the callback (the watch thread) does not wait

    def step(self) -> float:
        """One stream, then the pause before the next: after a failure the loop takes it from
        ``backoff``, after a clean end the backoff starts again; a compaction re-lists at once."""
        try:
            self.stream_once()
        except Compacted:
            self.relist()
            return 0.0
        except Exception:  # any failure: the loop reports it and resumes, never dies
            self.note_restart()
            raise
        self.note_restart()
        return self.backoff.reset().next()

    def note_restart(self) -> None:
        self._created.clear()
        self.restarts += 1

    def describe_failure(self, exc: BaseException) -> str:
        return f"interrupted at revision {self.last_revision}: {describe(exc)}"

    def stream_once(self) -> None:
        """One watch stream on one member, until it ends or fails."""
        try:
            endpoint, stubs = self._conn.pick()
        except NoServerAvailableError:
            self.loop.wait(self._conn.wait_for_retry())
            return
        self.endpoint = endpoint.netloc
        token = None
        try:
            token = self._conn.authorize(stubs, self._conn.opts.call_timeout)
            for response in self.open_stream(stubs):
                self.handle(response)
        except TokenRefused:
            self._conn.refused(token)
            raise
        except grpc.RpcError as exc:
            if not self.loop.stopping and exc.code() in RETRYABLE:
                endpoint.fail()
            raise
        finally:
            self._end_stream()

    def open_stream(self, stubs) -> Iterator[etcdrpc.WatchResponse]:
        key, range_end = calc_range(self.prefix)
        create = etcdrpc.WatchCreateRequest(
            key=key, range_end=range_end, progress_notify=True, start_revision=self.next_revision
        )
        requests: queue.Queue = queue.Queue()
        requests.put(etcdrpc.WatchRequest(create_request=create))
        call = stubs.watch.Watch(iter(requests.get, None), metadata=REQUIRE_LEADER)
        with self._call_lock:
            self._call, self._requests = call, requests
        if self.loop.stopping:
            self._end_stream()
        return call

    def handle(self, response: etcdrpc.WatchResponse) -> None:
        if response.compact_revision:
            raise Compacted(response.compact_revision)
        if response.canceled:
            reason = response.cancel_reason or "no reason"
            error = TokenRefused if "invalid auth token" in reason else RuntimeError
            raise error(f"watch canceled by etcd: {reason}")
        if response.created:
            if not self.next_revision:
                self.next_revision = response.header.revision + 1
            self._created.set()
            self.loop.recovered()  # the stream is up: a later failure starts a new stretch
        if response.events:
            events = tuple(to_event(e) for e in response.events)
            self.next_revision = events[-1].kv.mod_revision + 1
            self.deliver(WatchUpdate(events[-1].kv.mod_revision, events))
        elif not response.created and response.header.revision >= self.next_revision:
            self.next_revision = response.header.revision + 1  # progress: nothing missed

    def relist(self) -> None:
        """The resume revision was compacted: hand over the whole prefix as a snapshot."""
        try:
            kvs, revision = self._lister.range_at(self.prefix)
        except CNIError as exc:
            log.warning("watch %s: re-list failed: %s", self.prefix, exc)
            self.loop.wait(BACKOFF_MAX)
            return
        log.info(
            "watch %s: revision %d compacted, re-listed %d keys at %d",
            self.prefix,
            self.next_revision,
            len(kvs),
            revision,
        )
        self.relists += 1
        self.next_revision = revision + 1
        self.deliver(WatchUpdate(revision, tuple(WatchEvent("put", kv) for kv in kvs), True))

    def deliver(self, update: WatchUpdate) -> None:
        try:
            self._callback(update)
        except Exception:  # the owner's bug must not end the watch
            log.exception("watch %s: callback failed at revision %d", self.prefix, update.revision)

    def _end_stream(self) -> None:
        with self._call_lock:
            call, requests = self._call, self._requests
            self._call = self._requests = None
        if requests is not None:
            requests.put(None)
        if call is not None:
            call.cancel()


def describe(exc: BaseException) -> str:
    return describe_rpc_error(exc) if isinstance(exc, grpc.RpcError) else str(exc)

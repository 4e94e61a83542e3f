"""One kind followed from the API server: list, then watch from the list's resourceVersion.

A ``Reflector`` keeps a ``Sink`` equal to the server's collection, as client-go's reflector
does, in one ``Loop`` thread:

- **list**, page by page (``limit``/``continue``), each item converted by the sink as it comes
  (``Sink.convert``: the compact form it keeps; an object it cannot read is skipped and logged
  once); the sink gets the whole collection (``Sink.replace``) only once the last page is in,
  so a list cut short (a dead server, an expired ``continue``) never removes anything;
- **watch** from the list's resourceVersion with bookmarks (``allowWatchBookmarks``: a quiet
  kind's resourceVersion stays recent, so a rewatch rarely meets 410), each event given to the
  sink (``Sink.apply``); a stream the server ends (``timeoutSeconds``, jittered) or that breaks
  is watched again from the last resourceVersion seen;
- **410 Gone** (an ERROR event or a Status: the resourceVersion was compacted away), and every
  ``resyncInterval``: list again;
- a failure (no answer, a Status) pauses with exponential backoff and jitter (0.5 s doubling to
  30 s, each pause 50-100% of it), reset by the next request that succeeds. 403 Forbidden is
  logged once per verb and resource with the RBAC rule that is missing, and counted, until the
  request succeeds.

``synced`` is True from the first complete list on (the consumer programs nothing before it);
``up`` says whether the last request was answered. Metrics: ``pycni_kube_up{kind}``,
``pycni_kube_synced{kind}``, ``pycni_kube_events_total{kind,type}``,
``pycni_kube_lists_total{kind,reason}``, ``pycni_kube_forbidden{verb,resource}``,
``pycni_kube_skipped_objects_total{kind}``, ``pycni_kube_request_failures_total{kind}``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from common.collector import paused_gc
from common.loop import Backoff, Errors, Loop
from common.metrics import Registry
from kube.api import (
    FORBIDDEN,
    GONE,
    Api,
    ApiStatus,
    Stream,
    Unreachable,
    decode_document,
    status_error,
)
from kube.config import KubeConfig
from kube.kinds import Kind

log = logging.getLogger("pycnid.kube")
T = TypeVar("T")
FIRST_PAUSE, MAX_PAUSE = 0.5, 30.0
#: What a sink's ``convert`` raises for an object it cannot read (a field of another type or
#: missing): the object is left out, never the whole kind.
UNREADABLE: tuple[type[Exception], ...] = (ValueError, TypeError, KeyError, AttributeError)


class Sink(Protocol[T]):
    """What a reflector keeps current: converts objects, takes whole lists and events.

    ``listed`` is called once, after the first whole list was given to ``replace`` and the
    reflector reports its kind ``synced``: a consumer that waits for every kind to be listed
    is woken there (woken by ``replace`` alone, it would find the kind not yet synced)."""

    def convert(self, obj: Mapping[str, Any]) -> T: ...

    def replace(self, items: dict[str, T]) -> None: ...

    def apply(self, key: str, item: T | None) -> None: ...

    def listed(self) -> None: ...


def list_whole(api: Api, kind: Kind, page_size: int, take: Callable[[list[Any]], None]) -> str:
    """Every object of ``kind``, page by page (``take`` gets each page's items as it comes);
    the list's resourceVersion ("0" if the server gave none).

    The next page is asked for as soon as a page's continue token is read, and read on a
    helper thread while ``take`` converts this one: the server's answer (~0.4 s over the 40
    pages of 10k Services and their slices, bench/svc_api.py) overlaps the conversion instead
    of following it. One request is in flight at a time, as without the helper; a failed
    read raises here, in page order, and a ``take`` that raises waits for the read first."""
    params = {"limit": str(page_size)}
    with ThreadPoolExecutor(1, thread_name_prefix=f"kube-list-{kind.resource}") as ahead:
        data = api.read(kind.path, params)
        while True:
            with paused_gc():  # the page's ~10^4 objects live and die unseen by the collector
                page = decode_document(data, kind.path)
                token, rv = page_meta(page)
                following = None
                if token:
                    params["continue"] = str(token)
                    following = ahead.submit(api.read, kind.path, dict(params))
                take(page_items(page))
                del page, data
            if following is None:
                break
            data = following.result()
    return rv if isinstance(rv, str) and rv else "0"


def page_meta(page: Mapping[str, Any]) -> tuple[Any, Any]:
    """A list page's continue token and resourceVersion."""
    meta = page.get("metadata") or {}
    return meta.get("continue"), meta.get("resourceVersion")


def page_items(page: Mapping[str, Any]) -> list[Any]:
    items = page.get("items") or []
    return items if isinstance(items, list) else []


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` (``name`` for a cluster-scoped object)."""
    meta = obj.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name:
        raise ValueError("an object without metadata.name")
    return f"{namespace}/{name}" if namespace else name


def resource_version(obj: Mapping[str, Any]) -> str | None:
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return value if isinstance(value, str) and value else None


class KubeMetrics:
    def __init__(self, registry: Registry) -> None:
        self.up = registry.gauge("pycni_kube_up", "1 while the API server answers, by kind")
        self.synced = registry.gauge(
            "pycni_kube_synced", "1 once a kind was listed whole, by kind"
        )
        self.events = registry.counter(
            "pycni_kube_events_total", "watch events received, by kind and type"
        )
        self.lists = registry.counter(
            "pycni_kube_lists_total", "complete lists, by kind and reason"
        )
        self.forbidden = registry.gauge(
            "pycni_kube_forbidden", "1 while RBAC refuses a verb on a resource"
        )
        self.skipped = registry.counter(
            "pycni_kube_skipped_objects_total", "objects that could not be read, by kind"
        )
        self.failures = registry.counter(
            "pycni_kube_request_failures_total", "list or watch requests that failed, by kind"
        )


@dataclass
class Failure:
    """The error of a failing stretch (logged once), and its backoff."""

    backoff: Backoff
    logged: str = ""


class Reflector(Generic[T]):
    def __init__(
        self,
        api: Api,
        kind: Kind,
        sink: Sink[T],
        config: KubeConfig,
        metrics: KubeMetrics,
    ) -> None:
        self.api, self.kind, self.sink, self.config, self.metrics = (
            api,
            kind,
            sink,
            config,
            metrics,
        )
        self.rv: str | None = None  # None: list next
        self.relist_due = 0.0
        self.synced = False
        self.up = False
        self.failure = Failure(Backoff(FIRST_PAUSE, MAX_PAUSE))
        self.jitter = random.Random()  # its own: nodes' reflectors must not move in step
        self.forbidden: set[str] = set()  # verbs refused, logged once each
        self.bad: set[str] = set()  # keys of objects that could not be read
        self.stream: Stream | None = None
        self.lock = threading.Lock()
        self.loop = Loop(
            f"kube-{kind.resource}",
            self.step,
            retry=self.pause,
            errors=Errors(log, f"kube {kind.resource}", logging.DEBUG, (ApiStatus, Unreachable)),
        )
        metrics.synced.set(0, kind=kind.kind)
        metrics.up.set(0, kind=kind.kind)

    def start(self) -> Reflector[T]:
        self.loop.start()
        return self

    def stop(self) -> None:
        self.loop.stop(wait=False)
        with self.lock:
            if self.stream is not None:
                self.stream.close()
        self.loop.join()

    def step(self) -> float:
        """A list if one is due, then one watch until its stream ends (raises on failure:
        the loop pauses ``pause()`` seconds)."""
        verb = "list"
        try:
            if self.rv is None or time.monotonic() >= self.relist_due:
                self.relist()
            verb = "watch"
            self.watch()
        except ApiStatus as exc:
            if exc.code == GONE:  # compacted: list again at once
                log.info("kube: %s %s: %s; listing again", verb, self.kind.resource, exc)
                self.rv = None
                return 0.0
            self.note_failure(verb, exc)
            raise
        except Unreachable as exc:
            self.note_failure(verb, exc)
            raise
        return 0.0

    def pause(self) -> float:
        """The backoff of a failing stretch, jittered (50-100%)."""
        return self.failure.backoff.next() * (0.5 + self.jitter.random() / 2)

    def relist(self) -> None:
        items: dict[str, T] = {}

        def take(page: list[Any]) -> None:
            self.note_success("list")
            for obj in page:  # within list_whole's pause of the collector
                self.convert_into(items, obj)

        rv = list_whole(self.api, self.kind, self.config.page_size, take)
        with paused_gc():
            self.sink.replace(items)
        self.rv = rv
        self.relist_due = time.monotonic() + self.config.resync_interval
        reason = "resync" if self.synced else "start"
        self.metrics.lists.inc(kind=self.kind.kind, reason=reason)
        if not self.synced:
            self.synced = True
            self.metrics.synced.set(1, kind=self.kind.kind)
            log.info("kube: %s listed whole (%d)", self.kind.resource, len(items))
            self.sink.listed()

    def convert_into(self, items: dict[str, T], obj: Any) -> None:
        try:
            key = object_key(obj)
        except (ValueError, AttributeError):
            self.metrics.skipped.inc(kind=self.kind.kind)
            return
        try:
            items[key] = self.sink.convert(obj)
            self.bad.discard(key)
        except UNREADABLE as exc:
            self.skip(key, exc)

    def skip(self, key: str, exc: Exception) -> None:
        self.metrics.skipped.inc(kind=self.kind.kind)
        if key not in self.bad:
            self.bad.add(key)
            log.warning("kube: ignoring %s %s: %s", self.kind.kind, key, exc)

    def watch(self) -> None:
        remaining = max(1.0, self.relist_due - time.monotonic())
        timeout = int(min(self.config.watch_timeout * self.jitter.uniform(0.8, 1.0), remaining))
        params = {
            "watch": "true",
            "resourceVersion": self.rv or "0",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(max(1, timeout)),
        }
        stream = self.api.stream(
            self.kind.path, params, read_timeout=timeout + self.config.request_timeout
        )
        with self.lock:
            if self.loop.stopping:
                stream.close()
                return
            self.stream = stream
        self.note_success("watch")
        try:
            for event in stream.events():
                self.on_event(event)
                if self.loop.stopping:
                    return
        finally:
            with self.lock:
                self.stream = None
            stream.close()

    def on_event(self, event: Mapping[str, Any]) -> None:
        kind, obj = str(event.get("type")), event["object"]
        if kind == "ERROR":
            raise status_error(obj)
        self.metrics.events.inc(kind=self.kind.kind, type=kind)
        rv = resource_version(obj)
        if kind == "BOOKMARK":
            self.rv = rv or self.rv
            return
        try:
            key = object_key(obj)
        except ValueError:
            self.metrics.skipped.inc(kind=self.kind.kind)
            return
        if kind == "DELETED":
            self.bad.discard(key)
            self.sink.apply(key, None)
        elif kind in ("ADDED", "MODIFIED"):
            try:
                item = self.sink.convert(obj)
            except UNREADABLE as exc:
                self.skip(key, exc)
                self.sink.apply(key, None)  # what it was is no longer what the API holds
            else:
                self.bad.discard(key)
                self.sink.apply(key, item)
        self.rv = rv or self.rv

    def note_success(self, verb: str) -> None:
        self.failure.backoff.reset()
        self.failure.logged = ""
        if not self.up:
            self.up = True
            self.metrics.up.set(1, kind=self.kind.kind)
        if verb in self.forbidden:
            self.forbidden.discard(verb)
            self.metrics.forbidden.set(0, verb=verb, resource=self.kind.resource)
            log.info("kube: %s %s allowed again", verb, self.kind.resource)

    def note_failure(self, verb: str, exc: Exception) -> None:
        """Count it; log it once per failing stretch (403: once per verb until allowed)."""
        self.metrics.failures.inc(kind=self.kind.kind)
        if isinstance(exc, ApiStatus) and exc.code == FORBIDDEN:
            self.note_forbidden(verb, exc)
            return
        if self.up:
            self.up = False
            self.metrics.up.set(0, kind=self.kind.kind)
        text = f"{type(exc).__name__}"
        if self.failure.logged != text:
            self.failure.logged = text
            log.warning(
                "kube: %s %s failed (the kernel keeps what was programmed; retrying): %s",
                verb,
                self.kind.resource,
                exc,
            )

    def note_forbidden(self, verb: str, exc: ApiStatus) -> None:
        if verb in self.forbidden:
            return
        self.forbidden.add(verb)
        self.metrics.forbidden.set(1, verb=verb, resource=self.kind.resource)
        group = self.kind.group or '""'
        log.error(
            "kube: RBAC forbids %s on %s (API group %s): grant verb %r on resource %r in "
            "pycni's ClusterRole (conf/kubernetes/); the server said: %s",
            verb,
            self.kind.resource,
            group,
            verb,
            self.kind.resource,
            exc.message,
        )

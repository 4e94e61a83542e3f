"""pycnid's Kubernetes source (kube/) against the fake API server (tests/fixtures/kubeapi.py),
which speaks kube-apiserver's list/watch protocol: paged lists, watches from a
resourceVersion, bookmarks, 410 Gone, 403, closed streams, a slow and a dead server.

A sink records what the reflector hands it; the invariant every case checks is the one the
proxy relies on: once synced, the sink equals the server's collection (eventually), and it is
never handed a partial list.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.metrics import Registry
from kube.api import open_api
from kube.config import KubeConfig
from kube.kinds import ENDPOINT_SLICE, SERVICE
from kube.reflector import KubeMetrics, Reflector, list_whole
from kube.source import KubeSource
from tests.fixtures.kubeapi import FakeKubeAPI, endpoint_slice, service
from tests.fixtures.waiting import wait_for


class RecordingSink:
    """Keeps {key: resourceVersion-free name} like a consumer, and every list it was given;
    at each ``listed`` call, what ``probe`` (a consumer's own look: is it synced?) said."""

    def __init__(self, probe: Callable[[], bool] = lambda: True) -> None:
        self.items: dict[str, str] = {}
        self.lists: list[set[str]] = []
        self.listed_calls: list[tuple[int, bool]] = []  # (lists given by then, probe's answer)
        self.probe = probe
        self.lock = threading.Lock()

    def convert(self, obj: Mapping[str, Any]) -> str:
        name = obj["metadata"]["name"]
        if name.startswith("bad"):
            raise ValueError("unreadable on purpose")
        return str(obj["spec"]["ports"][0]["port"]) if "spec" in obj else name

    def replace(self, items: dict[str, str]) -> None:
        with self.lock:
            self.items = dict(items)
            self.lists.append(set(items))

    def apply(self, key: str, item: str | None) -> None:
        with self.lock:
            if item is None:
                self.items.pop(key, None)
            else:
                self.items[key] = item

    def listed(self) -> None:
        with self.lock:
            self.listed_calls.append((len(self.lists), self.probe()))

    def snapshot(self) -> dict[str, str]:
        with self.lock:
            return dict(self.items)


def svc(name: str, port: int = 80) -> dict:
    return service("default", name, ["10.96.0.1"], [port])


@pytest.fixture
def kubeconfig(kube_api: FakeKubeAPI, tmp_path) -> KubeConfig:
    path = kube_api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    return KubeConfig(
        kubeconfig=path, resync_interval=300, page_size=2, watch_timeout=30, request_timeout=2
    )


@pytest.fixture
def follow(kubeconfig: KubeConfig) -> Iterator[Any]:
    made: list[Reflector[Any]] = []

    def start(config: KubeConfig = kubeconfig) -> tuple[Reflector[Any], RecordingSink, Registry]:
        registry, sink = Registry(), RecordingSink(lambda: reflector.synced)
        reflector = Reflector(open_api(config), SERVICE, sink, config, KubeMetrics(registry))
        made.append(reflector.start())
        return reflector, sink, registry

    yield start
    for reflector in made:
        reflector.stop()


def wait_until(probe: Any, timeout: float = 10.0, what: str = "") -> None:
    wait_for(what, probe, timeout)


def expect(api: FakeKubeAPI, sink: RecordingSink, config: KubeConfig) -> None:
    """The sink ends equal to the server's Services (their first port, by key), as an
    independent list through the same client reads them."""
    doc = open_api(config).get("/api/v1/services", {})
    want = {
        f"default/{i['metadata']['name']}": str(i["spec"]["ports"][0]["port"])
        for i in doc["items"]
    }
    wait_until(lambda: sink.snapshot() == want, timeout=10, what=f"sink == {want}")


def test_a_paged_list_then_watch_follows_puts_modifies_and_deletes(
    kube_api, kubeconfig, follow
) -> None:
    for i in range(5):
        kube_api.put(svc(f"s{i}", 80 + i))
    reflector, sink, registry = follow()
    wait_until(lambda: reflector.synced, timeout=10, what="synced")
    assert sink.lists == [{f"default/s{i}" for i in range(5)}]  # one whole list, 3 pages
    assert sink.listed_calls == [(1, True)]  # after the list was handed over, synced already
    pages = [r for r in kube_api.requests if r[1] == "/api/v1/services" and "watch" not in r[2]]
    assert len(pages) == 3 and all(r[2]["limit"] == "2" for r in pages)
    kube_api.put(svc("s1", 1000))
    kube_api.delete("Service", "default", "s0")
    kube_api.put(svc("s9", 90))
    expect(kube_api, sink, kubeconfig)
    watch = [r for r in kube_api.requests if r[2].get("watch") in ("true", "1")][0][2]
    assert watch["allowWatchBookmarks"] == "true" and int(watch["resourceVersion"]) >= 5
    text = registry.render()
    assert 'pycni_kube_synced{kind="Service"} 1' in text
    assert 'pycni_kube_up{kind="Service"} 1' in text
    assert 'pycni_kube_events_total{kind="Service",type="DELETED"} 1' in text


def test_bookmarks_move_the_resource_version_so_a_rewatch_starts_from_there(
    kube_api, follow
) -> None:
    kube_api.bookmark_interval = 0.2
    reflector, sink, _ = follow()
    wait_until(lambda: reflector.synced, timeout=10, what="synced")
    kube_api.put(svc("other", 1))  # moves the server's resourceVersion...
    wait_until(lambda: "default/other" in sink.snapshot(), timeout=5, what="event")
    kube_api.delete("Service", "default", "other")
    wait_until(lambda: not sink.snapshot(), timeout=5, what="delete")
    newest = str(kube_api.resource_version)
    wait_until(lambda: reflector.rv == newest, timeout=5, what="a bookmark at the newest RV")
    kube_api.compact()  # every older resourceVersion is gone: a rewatch from rv still works
    kube_api.close_watches()
    wait_until(
        lambda: sum(1 for r in kube_api.requests if r[2].get("watch")) >= 2, 5, what="rewatch"
    )
    time.sleep(0.3)
    assert len(sink.lists) == 1  # no relist was needed


def test_410_gone_relists_and_the_gap_is_caught_up_deletions_included(
    kube_api, kubeconfig, follow
) -> None:
    kube_api.bookmark_interval = 3600.0  # no bookmark saves the old resourceVersion
    for name in ("a", "b", "c"):
        kube_api.put(svc(name))
    reflector, sink, registry = follow()
    wait_until(lambda: reflector.synced, timeout=10, what="synced")
    kube_api.stop()  # what happens now, the reflector cannot see...
    kube_api.delete("Service", "default", "a")
    kube_api.put(svc("d", 8080))
    kube_api.compact()  # ...and its resourceVersion is compacted away
    kube_api.start()
    expect(kube_api, sink, kubeconfig)
    assert sink.lists[-1] == {"default/b", "default/c", "default/d"}
    assert 'pycni_kube_lists_total{kind="Service",reason="resync"} 1' in registry.render()


def test_the_next_page_is_read_while_this_one_is_taken(kube_api, kubeconfig) -> None:
    """``list_whole`` asks for page n+1 as soon as page n's continue token is read, and the
    items still reach ``take`` whole and in page order."""
    for i in range(7):
        kube_api.put(svc(f"s{i}", 80 + i))
    api = open_api(kubeconfig)
    real_read = api.read
    events: list[tuple[str, int]] = []
    asked = threading.Condition()

    def read(path: str, params: Mapping[str, str]) -> bytes:
        with asked:
            events.append(("read", sum(1 for e in events if e[0] == "read") + 1))
            asked.notify_all()
        return real_read(path, params)

    def take(items: list[Any]) -> None:
        page = sum(1 for e in events if e[0] == "take") + 1
        events.append(("take", page))
        taken.extend(i["metadata"]["name"] for i in items)
        with asked:  # the next page's read starts while this page is being taken
            asked.wait_for(lambda: ("read", page + 1) in events or page == 4, timeout=5)
        events.append(("taken", page))

    api.read = read  # type: ignore[method-assign]
    taken: list[str] = []
    rv = list_whole(api, SERVICE, 2, take)
    assert taken == [f"s{i}" for i in range(7)] and rv == str(kube_api.resource_version)
    for page in (1, 2, 3):  # 4 pages of 2
        assert events.index(("read", page + 1)) < events.index(("taken", page))
    assert [e for e in events if e[0] == "take"] == [("take", n) for n in (1, 2, 3, 4)]
    assert ("read", 5) not in events  # the last page has no continue: nothing more asked


def test_a_list_cut_short_is_never_handed_over_partially(kube_api, kubeconfig) -> None:
    """An expired continue (410 in the middle of a paged list): the pages read so far are
    dropped, and the reflector lists again from the start."""
    for i in range(6):
        kube_api.put(svc(f"s{i}"))
    registry, sink = Registry(), RecordingSink()
    api = open_api(kubeconfig)
    pages = {"n": 0}
    real_read = api.read

    def read(path: str, params: Mapping[str, str]) -> bytes:
        data = real_read(path, params)
        pages["n"] += 1
        if pages["n"] == 2:
            kube_api.put(svc("late"))
            kube_api.compact()  # the next page's continue token has expired
        return data

    api.read = read  # type: ignore[method-assign]
    reflector = Reflector(api, SERVICE, sink, kubeconfig, KubeMetrics(registry)).start()
    try:
        wait_until(lambda: reflector.synced, timeout=10, what="synced")
        assert sink.lists == [{f"default/s{i}" for i in range(6)} | {"default/late"}]
    finally:
        reflector.stop()


def test_403_is_logged_once_naming_verb_and_resource_then_recovers(
    kube_api, kubeconfig, follow, caplog
) -> None:
    kube_api.put(svc("a"))
    kube_api.forbid("services", "list")
    with caplog.at_level(logging.INFO, logger="pycnid.kube"):
        reflector, sink, registry = follow()
        wait_until(
            lambda: 'pycni_kube_forbidden{resource="services",verb="list"} 1' in registry.render(),
            timeout=5,
            what="the forbidden metric",
        )
        time.sleep(2.0)  # several backed-off retries
        refusals = [r for r in kube_api.requests if r[1] == "/api/v1/services"]
        forbids = [r for r in caplog.records if "RBAC forbids list on services" in r.message]
        assert len(refusals) >= 2 and len(forbids) == 1
        assert "grant verb 'list' on resource 'services'" in forbids[0].message
        assert not reflector.synced and sink.lists == []
        kube_api.allow("services", "list")
        expect(kube_api, sink, kubeconfig)
    assert 'pycni_kube_forbidden{resource="services",verb="list"} 0' in registry.render()


def test_a_dead_server_keeps_what_was_listed_then_catches_up(kube_api, kubeconfig, follow) -> None:
    kube_api.put(svc("a"))
    kube_api.put(svc("b"))
    reflector, sink, registry = follow()
    wait_until(lambda: reflector.synced, timeout=10, what="synced")
    kube_api.stop()
    wait_until(lambda: not reflector.up, timeout=10, what="down")
    assert 'pycni_kube_up{kind="Service"} 0' in registry.render()
    assert set(sink.snapshot()) == {"default/a", "default/b"}  # nothing removed meanwhile
    kube_api.delete("Service", "default", "a")
    kube_api.put(svc("c"))
    kube_api.start()
    expect(kube_api, sink, kubeconfig)
    assert reflector.up


def test_a_slow_server_is_followed_and_an_unreadable_object_skipped(kube_api, follow) -> None:
    kube_api.delay = 0.3
    kube_api.put(svc("a"))
    kube_api.put(svc("bad-one"))
    reflector, sink, registry = follow()
    wait_until(lambda: reflector.synced, timeout=10, what="synced")
    assert set(sink.snapshot()) == {"default/a"}
    kube_api.put(svc("bad-one", 81))  # still unreadable: stays out
    kube_api.put(svc("b"))
    wait_until(lambda: "default/b" in sink.snapshot(), timeout=10, what="b")
    assert "default/bad-one" not in sink.snapshot()
    assert 'pycni_kube_skipped_objects_total{kind="Service"} 2' in registry.render()


def test_resync_interval_lists_again(kube_api, kubeconfig, follow) -> None:
    kube_api.put(svc("a"))
    config = KubeConfig(**{**kubeconfig.__dict__, "resync_interval": 1.0})
    reflector, sink, _ = follow(config)
    wait_until(lambda: len(sink.lists) >= 3, timeout=10, what="two resyncs")
    assert all(found == {"default/a"} for found in sink.lists)
    assert sink.listed_calls == [(1, True)]  # once, after the first list, never at a resync


def test_the_source_is_synced_once_every_kind_is_listed_whole(kube_api, kubeconfig) -> None:
    kube_api.put(svc("a"))
    kube_api.put(endpoint_slice("default", "a-1", "a", endpoints=["10.1.0.1"], ports=[80]))
    kube_api.forbid("endpointslices", "list")
    source = KubeSource(open_api(kubeconfig), kubeconfig, Registry())
    both = (SERVICE, ENDPOINT_SLICE)
    # a consumer woken by a kind's ``listed`` looks at the source: the last kind finds it synced
    services, slices = (
        RecordingSink(lambda: source.synced(both)),
        RecordingSink(lambda: source.synced(both)),
    )
    source.follow(SERVICE, services)
    source.follow(ENDPOINT_SLICE, slices)
    source.start()
    try:
        wait_until(lambda: source.synced([SERVICE]), timeout=10, what="services")
        assert not source.synced([SERVICE, ENDPOINT_SLICE])
        kube_api.allow("endpointslices", "list")
        wait_until(lambda: source.synced([SERVICE, ENDPOINT_SLICE]), 10, what="both kinds")
        assert set(source.status()) == {"services", "endpointslices"}
        assert services.listed_calls == [(1, False)] and slices.listed_calls == [(1, True)]
    finally:
        source.stop()


NAMES = st.sampled_from(["a", "b", "c", "bad-d"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), NAMES, st.integers(1, 65535)),
        st.tuples(st.just("delete"), NAMES),
        st.tuples(st.sampled_from(["compact", "close", "restart"])),
    ),
    max_size=8,
)


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=OPS)
def test_any_sequence_of_changes_and_faults_ends_with_the_servers_collection(
    kube_api, kubeconfig, follow, ops
) -> None:
    """The reflector's invariant under generated histories (puts, deletes, compactions,
    closed streams, a server restart, unreadable objects): once the server is quiet the sink
    holds exactly the server's readable objects, and no unreadable one was ever handed over."""
    if not hasattr(kube_api, "followed"):
        kube_api.followed = follow()  # one reflector follows every example's history
    reflector, sink, _ = kube_api.followed
    for op in ops:
        if op[0] == "put":
            kube_api.put(svc(op[1], op[2]))
        elif op[0] == "delete":
            present = f"default/{op[1]}" in names_on(kube_api, kubeconfig)
            if present:
                kube_api.delete("Service", "default", op[1])
        elif op[0] == "compact":
            kube_api.compact()
        elif op[0] == "close":
            kube_api.close_watches()
        else:
            kube_api.stop()
            kube_api.start()
    doc = open_api(kubeconfig).get("/api/v1/services", {})
    want = {
        f"default/{i['metadata']['name']}": str(i["spec"]["ports"][0]["port"])
        for i in doc["items"]
        if not i["metadata"]["name"].startswith("bad")
    }
    wait_until(lambda: sink.snapshot() == want, timeout=15, what=f"sink == {want}")
    assert all(not any(k.startswith("default/bad") for k in found) for found in sink.lists)


def names_on(api: FakeKubeAPI, config: KubeConfig) -> set[str]:
    doc = open_api(config).get("/api/v1/services", {})
    return {f"default/{i['metadata']['name']}" for i in doc["items"]}

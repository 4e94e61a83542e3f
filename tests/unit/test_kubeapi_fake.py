"""The fake API server (tests/fixtures/kubeapi.py) driven by the official ``kubernetes`` client
as pycnid's source will drive it: a kubeconfig, the typed list functions with
``_preload_content=False``, and watch streams read line by line. The source's tests trust this
server to behave like kube-apiserver, so each test pins one behaviour of the real protocol."""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from tests.fixtures.kubeapi import FakeKubeAPI, endpoint_slice, network_policy, service

Stream = Iterator[dict]
TIMEOUT = (2.0, 3.0)  # connect, read: a missing event fails the test instead of hanging it


def connect(api: FakeKubeAPI, path: str) -> client.ApiClient:
    """An ApiClient configured from a kubeconfig the server wrote, as pycnid will load it."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=api.write_kubeconfig(path), client_configuration=cfg)
    cfg.retries = 0  # a refused connection is an answer here, not something to retry
    return client.ApiClient(cfg)


@pytest.fixture
def core(kube_api: FakeKubeAPI, tmp_path) -> Iterator[client.CoreV1Api]:
    with connect(kube_api, str(tmp_path / "kubeconfig")) as api_client:
        yield client.CoreV1Api(api_client)


def services(n: int, ns: str = "default") -> list[dict]:
    return [service(ns, f"svc{i}", [f"10.96.0.{i + 1}"], [80]) for i in range(n)]


def body(resp: object) -> dict:
    """The JSON of a ``_preload_content=False`` answer: a urllib3 response, whatever the
    generated signature says (it names the typed list)."""
    return json.loads(cast(urllib3.HTTPResponse, resp).data)


def list_page(core: client.CoreV1Api, **kw: Any) -> dict:
    return body(
        core.list_service_for_all_namespaces(
            _preload_content=False, _request_timeout=TIMEOUT, **kw
        )
    )


def names(items: list[dict]) -> list[str]:
    return [
        f"{item['metadata'].get('namespace', '')}/{item['metadata']['name']}" for item in items
    ]


@contextlib.contextmanager
def watching(list_fn: Callable[..., Any], **kw: Any) -> Iterator[Stream]:
    """A watch stream's JSON lines, split as the client library's own Watch splits them. One
    iterator per stream: dropping a half-read one makes urllib3 close the response."""
    resp = list_fn(watch=True, _preload_content=False, _request_timeout=TIMEOUT, **kw)
    try:
        yield (json.loads(line) for line in iter_resp_lines(resp))
    finally:
        resp.close()


def take(stream: Stream, n: int) -> list[dict]:
    got = list(itertools.islice(stream, n))
    assert len(got) == n, f"the stream ended after {got}"
    return got


def described(got: list[dict]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"]["name"]) for e in got]


def status_of(exc: ApiException) -> dict:
    return json.loads(exc.body or "{}")


def test_pages_stay_on_the_first_pages_snapshot(kube_api: FakeKubeAPI, core) -> None:
    for obj in services(3, "b") + services(2, "a"):
        kube_api.put(obj)
    first = list_page(core, limit=2)
    snapshot_rv = first["metadata"]["resourceVersion"]
    kube_api.put(service("b", "svc2", ["10.96.9.9"], [443]))  # on a later page
    kube_api.delete("Service", "b", "svc1")
    kube_api.put(service("a", "svc9", ["10.96.0.99"], [80]))
    second = list_page(core, limit=2, _continue=first["metadata"]["continue"])
    third = list_page(core, limit=2, _continue=second["metadata"]["continue"])

    pages = [first, second, third]
    assert [page["metadata"]["resourceVersion"] for page in pages] == [snapshot_rv] * 3
    assert "continue" not in third["metadata"]
    items = [item for page in pages for item in page["items"]]
    assert names(items) == ["a/svc0", "a/svc1", "b/svc0", "b/svc1", "b/svc2"]
    assert items[-1]["spec"]["clusterIP"] == "10.96.0.3"  # the snapshot's state, not the put
    assert all("kind" not in item and "apiVersion" not in item for item in items)
    assert (first["kind"], first["apiVersion"]) == ("ServiceList", "v1")
    fresh = list_page(core)
    assert names(fresh["items"]) == ["a/svc0", "a/svc1", "a/svc9", "b/svc0", "b/svc2"]
    assert int(fresh["metadata"]["resourceVersion"]) == kube_api.resource_version


def test_namespaced_and_grouped_collections(kube_api: FakeKubeAPI, core, tmp_path) -> None:
    kube_api.put(endpoint_slice("a", "web-1", "web", "IPv4", ["10.0.0.1"], [80]))
    kube_api.put(endpoint_slice("b", "web-1", "web", "IPv6", ["fd00::1"], [80]))
    kube_api.put(network_policy("a", "deny"))
    discovery = client.DiscoveryV1Api(core.api_client)
    slices = body(discovery.list_namespaced_endpoint_slice("b", _preload_content=False))
    assert (slices["kind"], slices["apiVersion"]) == ("EndpointSliceList", "discovery.k8s.io/v1")
    assert [item["addressType"] for item in slices["items"]] == ["IPv6"]
    networking = client.NetworkingV1Api(core.api_client)
    resp = networking.list_network_policy_for_all_namespaces(_preload_content=False)
    assert names(body(resp)["items"]) == ["a/deny"]
    assert [request[1] for request in kube_api.requests] == [
        "/apis/discovery.k8s.io/v1/namespaces/b/endpointslices",
        "/apis/networking.k8s.io/v1/networkpolicies",
    ]


def test_unknown_paths_are_404_and_bad_parameters_400(kube_api: FakeKubeAPI, core) -> None:
    http = urllib3.PoolManager()
    auth = {"Authorization": "Bearer t0ken"}
    try:
        for path in ("/api/v1/secrets", "/api/v1/namespaces/a/nodes", "/apis/apps/v1/pods"):
            resp = http.request("GET", kube_api.url + path, headers=auth)
            assert (resp.status, body(resp)["reason"]) == (404, "NotFound")
        for query in ("continue=bm90LWEtdG9rZW4=", "watch=yes", "limit=-1"):
            resp = http.request("GET", f"{kube_api.url}/api/v1/pods?{query}", headers=auth)
            assert (resp.status, body(resp)["reason"]) == (400, "BadRequest")
    finally:
        http.clear()
    listed = list_page(core, resource_version="0", limit=10)  # accepted, newest served
    assert listed["metadata"]["resourceVersion"] == str(kube_api.resource_version)
    assert kube_api.requests[-1] == (
        "GET",
        "/api/v1/services",
        {"limit": "10", "resourceVersion": "0"},
    )


def test_watch_from_a_list_sees_exactly_the_later_events_in_order(
    kube_api: FakeKubeAPI, core
) -> None:
    for obj in services(3):
        kube_api.put(obj)
    listed = list_page(core)
    rv = listed["metadata"]["resourceVersion"]
    kube_api.put(service("default", "svc0", ["10.96.0.1"], [8080]))
    kube_api.delete("Service", "default", "svc1")
    kube_api.put(service("default", "svc7", ["10.96.0.7"], [80]))
    with watching(core.list_service_for_all_namespaces, resource_version=rv) as stream:
        got = take(stream, 3)
        kube_api.put(service("other", "live", ["10.96.1.1"], [80]))
        got += take(stream, 1)
    assert described(got) == [
        ("MODIFIED", "svc0"),
        ("DELETED", "svc1"),
        ("ADDED", "svc7"),
        ("ADDED", "live"),
    ]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in got]
    assert int(rv) < rvs[0] and rvs == sorted(set(rvs))
    deleted, last_listed = got[1]["object"], listed["items"][1]
    assert deleted["spec"] == last_listed["spec"]  # the last state, with a new version
    assert rvs[1] > int(last_listed["metadata"]["resourceVersion"])
    assert (deleted["kind"], deleted["apiVersion"]) == ("Service", "v1")


def test_watch_without_a_version_starts_with_every_object(kube_api: FakeKubeAPI, core) -> None:
    for obj in services(2) + services(1, "kube-system"):
        kube_api.put(obj)
    list_fn = core.list_namespaced_service
    with watching(list_fn, namespace="default", resource_version="0") as stream:
        got = take(stream, 2)
        kube_api.put(service("kube-system", "ignored", ["10.96.2.1"], [80]))
        kube_api.put(service("default", "later", ["10.96.2.2"], [80]))
        got += take(stream, 1)
    assert described(got) == [("ADDED", "svc0"), ("ADDED", "svc1"), ("ADDED", "later")]


def test_bookmarks_arrive_and_timeout_ends_the_stream(kube_api: FakeKubeAPI, core) -> None:
    kube_api.put(services(1)[0])
    kube_api.bookmark_interval = 0.3
    start = time.monotonic()
    with watching(
        core.list_service_for_all_namespaces,
        resource_version=str(kube_api.resource_version),
        allow_watch_bookmarks=True,
        timeout_seconds=1,
    ) as stream:
        got = list(stream)  # ends by itself after timeoutSeconds
    elapsed = time.monotonic() - start
    assert 1.0 <= elapsed < 2.0
    assert len(got) >= 2 and {e["type"] for e in got} == {"BOOKMARK"}
    assert got[0]["object"] == {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": str(kube_api.resource_version)},
    }
    assert kube_api.requests[-1][2]["allowWatchBookmarks"] == "true"


def test_watch_from_a_compacted_version_gets_a_410_error_event(
    kube_api: FakeKubeAPI, core
) -> None:
    old = kube_api.put(services(1)[0])["metadata"]["resourceVersion"]
    kube_api.put(service("default", "svc0", ["10.96.0.1"], [81]))
    kube_api.compact()
    # HTTP 200 (watching() would raise on anything else), then the one ERROR line
    with watching(core.list_service_for_all_namespaces, resource_version=old) as stream:
        got = list(stream)
    assert got == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {old} ({kube_api.resource_version})",
                "reason": "Expired",
                "code": 410,
            },
        }
    ]


def test_continue_from_a_compacted_snapshot_is_410_expired(kube_api: FakeKubeAPI, core) -> None:
    for obj in services(3):
        kube_api.put(obj)
    first = list_page(core, limit=1)
    kube_api.put(services(4)[3])
    kube_api.compact()
    with pytest.raises(ApiException) as caught:
        list_page(core, limit=1, _continue=first["metadata"]["continue"])
    assert caught.value.status == 410
    assert status_of(caught.value)["reason"] == "Expired"


def test_forbidden_is_403_in_rbacs_words(kube_api: FakeKubeAPI, core) -> None:
    kube_api.forbid("endpointslices", "watch")
    list_fn = client.DiscoveryV1Api(core.api_client).list_endpoint_slice_for_all_namespaces
    list_fn(_preload_content=False)  # list stays allowed
    with pytest.raises(ApiException) as caught, watching(list_fn):
        pass
    assert caught.value.status == 403
    assert status_of(caught.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'endpointslices is forbidden: User "system:serviceaccount:kube-system:pycni"'
        ' cannot watch resource "endpointslices" in API group "discovery.k8s.io"'
        " at the cluster scope",
        "reason": "Forbidden",
        "details": {"group": "discovery.k8s.io", "kind": "endpointslices"},
        "code": 403,
    }
    kube_api.allow("endpointslices", "watch")
    kube_api.put(endpoint_slice("a", "web-1", "web", "IPv4", ["10.0.0.1"], [80]))
    with watching(list_fn) as stream:
        assert described(take(stream, 1)) == [("ADDED", "web-1")]


def test_a_wrong_token_is_401(kube_api: FakeKubeAPI, tmp_path) -> None:
    kube_api.token = "the-real-one"
    with connect(kube_api, str(tmp_path / "kubeconfig")) as api_client:
        client.CoreV1Api(api_client).list_namespace(_preload_content=False)  # accepted
        kube_api.token = "rotated"
        with pytest.raises(ApiException) as caught:
            client.CoreV1Api(api_client).list_namespace(_preload_content=False)
    assert caught.value.status == 401
    assert status_of(caught.value)["reason"] == "Unauthorized"


def test_closed_watches_end_cleanly_and_a_rewatch_resumes(kube_api: FakeKubeAPI, core) -> None:
    kube_api.put(services(1)[0])
    rv = str(kube_api.resource_version)
    list_fn = core.list_service_for_all_namespaces
    with watching(list_fn, resource_version=rv) as stream:
        kube_api.put(services(2)[1])
        got = take(stream, 1)
        kube_api.close_watches()
        got += list(stream)  # the stream ends, without an error
    last = got[-1]["object"]["metadata"]["resourceVersion"]
    kube_api.put(services(3)[2])
    with watching(list_fn, resource_version=last) as stream:
        got += take(stream, 1)
    assert described(got) == [("ADDED", "svc1"), ("ADDED", "svc2")]


def test_stop_kills_streams_and_start_comes_back_on_the_same_address(
    kube_api: FakeKubeAPI, core
) -> None:
    kube_api.put(services(1)[0])
    url = kube_api.url
    with watching(core.list_service_for_all_namespaces) as stream:
        take(stream, 1)
        kube_api.stop()
        with pytest.raises(urllib3.exceptions.ProtocolError):
            list(stream)  # cut mid-stream: no last chunk
    host, port = url.removeprefix("http://").split(":")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=1).close()
    kube_api.start()
    assert kube_api.url == url
    assert names(list_page(core)["items"]) == ["default/svc0"]


def test_delay_slows_every_answer(kube_api: FakeKubeAPI, core) -> None:
    kube_api.delay = 0.3
    start = time.monotonic()
    list_page(core)
    assert time.monotonic() - start >= 0.3
    with pytest.raises(urllib3.exceptions.MaxRetryError) as caught:
        core.list_namespace(_preload_content=False, _request_timeout=(1.0, 0.1))
    assert isinstance(caught.value.reason, urllib3.exceptions.ReadTimeoutError)


def test_https_with_the_servers_ca(tmp_path) -> None:
    api = FakeKubeAPI(tls=True)
    try:
        api.start()
        api.put(services(1)[0])
        assert api.url.startswith("https://")
        with connect(api, str(tmp_path / "kubeconfig")) as api_client:
            resp = client.CoreV1Api(api_client).list_service_for_all_namespaces(
                _preload_content=False, _request_timeout=TIMEOUT
            )
            assert names(body(resp)["items"]) == ["default/svc0"]
        http = urllib3.PoolManager(retries=False)  # the system CAs do not know this one
        with pytest.raises(urllib3.exceptions.SSLError):
            http.request("GET", api.url + "/api/v1/services")
        http.clear()
    finally:
        api.close()

"""`pycni svc endpoint set|drain` and the conditions `pycni svc endpoints` shows, on SQLite and
on a real etcd: a change writes only the conditions it names (every other field and unknown
ones kept), drain marks terminating (not ready, still serving), every attachment of the Pod
unless --ifname names one, and bad input is refused naming it with nothing written."""

from __future__ import annotations

import json

import pytest

from services.record import EndpointRecord
from store.base import Put
from store.codec import encode


def conditions(store, key: str) -> tuple[bool, bool, bool]:
    e = EndpointRecord.from_bytes(key, store.get(key).value)
    return e.ready, e.serving, e.terminating


def snapshot(store) -> dict:
    return {kv.key: kv.value for kv in store.range("/")}


@pytest.fixture
def pods(store):
    """p1 on eth0 and net1 (eth0 with a field from a newer pycni), p2 on eth0."""
    made = [
        EndpointRecord("default", "p1", "eth0", ("10.22.0.5",), {"app": "web"}, "node1"),
        EndpointRecord("default", "p1", "net1", ("10.23.0.5",), {"app": "web"}, "node1"),
        EndpointRecord("default", "p2", "eth0", ("fd22::6",), {"app": "web"}, "node2"),
    ]
    store.txn([], [Put(e.key, e.to_bytes()) for e in made])
    store.txn([], [Put(made[0].key, encode({**made[0].to_dict(), "zone": "a"}))])
    return made


def test_set_changes_only_the_named_conditions_and_keeps_the_rest(svc, store, pods):
    eth0, net1, p2 = (e.key for e in pods)
    doc = svc("endpoint", "set", "default/p1", "--ifname", "eth0", "--not-ready")
    assert [
        (e["ifname"], e["ready"], e["serving"], e["terminating"]) for e in doc["endpoints"]
    ] == [("eth0", False, True, False)]
    assert conditions(store, eth0) == (False, True, False)
    assert conditions(store, net1) == conditions(store, p2) == (True, True, False)
    kept = json.loads(store.get(eth0).value)
    assert (
        kept["zone"] == "a" and kept["ips"] == ["10.22.0.5"] and kept["labels"] == {"app": "web"}
    )
    svc("endpoint", "set", "default/p1", "--ready", "--terminating", "--not-serving")
    assert conditions(store, eth0) == conditions(store, net1) == (True, False, True)


def test_drain_marks_every_attachment_terminating_and_endpoints_shows_it(svc, store, pods):
    svc("config", "set", "--cidr", "10.96.0.0/28")
    svc("create", "default/web", "--port", "80", "--selector", "app=web")
    doc = svc("endpoint", "drain", "default/p1")
    assert [e["ifname"] for e in doc["endpoints"]] == ["eth0", "net1"]
    assert conditions(store, pods[0].key) == conditions(store, pods[1].key) == (False, True, True)
    listed = svc("endpoints", "default/web")["endpoints"]
    assert [(e["pod"], e["ifname"], e["ready"], e["terminating"]) for e in listed] == [
        ("p1", "eth0", False, True),
        ("p1", "net1", False, True),
        ("p2", "eth0", True, False),
    ]
    table = svc("endpoints", "default/web", text=True)
    assert "CONDITIONS" in table and "serving,terminating" in table and "ready,serving" in table


@pytest.mark.parametrize(
    "args,named",
    [
        (["set", "default/p1"], "no endpoint condition given"),
        (["set", "default/p9", "--ready"], "no endpoint of Pod default/p9"),
        (["set", "default/p1", "--ifname", "net9", "--ready"], "default/p1 on net9"),
        (["drain", "nonsense"], "NAMESPACE/POD"),
        (["drain", "default/p1/x"], "NAMESPACE/POD"),
    ],
)
def test_bad_input_is_refused_naming_it_and_nothing_is_written(svc, store, pods, args, named):
    before = snapshot(store)
    assert named in svc("endpoint", *args, code=1)
    assert snapshot(store) == before

"""healthCheckNodePort through `pycni svc` on SQLite and on a real etcd: allocated from the
nodePort range for an externalTrafficPolicy Local NodePort Service (never a port another
Service or the Service itself holds), an explicit one honoured, kept on `set`, dropped and
freed when the Service leaves ETP Local, freed on `rm`; bad values refused naming the field
with nothing written. The index key ``nodeports/TCP/<port>`` holds it like a nodePort."""

from __future__ import annotations

import pytest

HC = "healthCheckNodePort"


@pytest.fixture
def svc(svc):
    """conftest's `pycni svc`, over service settings of a 10-port nodePort range."""
    svc("config", "set", "--cidr", "10.96.0.0/28", "--node-port-range", "30000-30009")
    return svc


def held(store) -> dict[str, str]:
    prefix = "/pycni/v1/nodeports/"
    return {kv.key.removeprefix(prefix): kv.value.decode() for kv in store.range(prefix)}


LOCAL = ("--type", "NodePort", "--external-traffic-policy", "Local")


def test_allocated_after_its_own_nodeports_kept_on_set_freed_on_rm(svc, store):
    svc("create", "default/other", "--type", "NodePort", "--port", "80")  # holds TCP/30000
    web = svc("create", "default/web", *LOCAL, "--port", "a:80", "--port", "b:81")["service"]
    assert [p["nodePort"] for p in web["ports"]] == [30001, 30002] and web[HC] == 30003
    assert held(store) == {
        "TCP/30000": "default/other",
        "TCP/30001": "default/web",
        "TCP/30002": "default/web",
        "TCP/30003": "default/web",
    }
    kept = svc("set", "default/web", "--selector", "app=web", "--port", "a:80")["service"]
    assert kept[HC] == 30003 and "TCP/30002" not in held(store)
    assert svc("show", "default/web")["service"][HC] == 30003
    gone = svc("rm", "default/web")
    assert gone["freed"]["nodePorts"] == ["TCP/30001", "TCP/30003"]
    assert held(store) == {"TCP/30000": "default/other"}


def test_leaving_etp_local_frees_it_and_coming_back_allocates_again(svc, store):
    svc("create", "default/web", *LOCAL, "--port", "80")
    cluster = svc("set", "default/web", "--external-traffic-policy", "Cluster")["service"]
    assert HC not in cluster and held(store) == {"TCP/30000": "default/web"}
    svc("create", "default/x", "--type", "NodePort", "--port", "80")  # takes TCP/30001
    back = svc("set", "default/web", "--external-traffic-policy", "Local")["service"]
    assert back[HC] == 30002


def test_an_explicit_port_is_honoured_and_can_be_changed(svc, store):
    web = svc("create", "default/web", *LOCAL, "--port", "80", "--health-check-node-port", "30009")
    assert web["service"][HC] == 30009
    moved = svc("set", "default/web", "--health-check-node-port", "30005")["service"]
    assert moved[HC] == 30005 and set(held(store)) == {"TCP/30000", "TCP/30005"}


@pytest.mark.parametrize(
    "args,named",
    [
        (["--type", "NodePort", "--port", "80", "--health-check-node-port", "30005"], HC),
        (["--port", "80", "--health-check-node-port", "30005"], HC),
        ([*LOCAL, "--port", "80", "--health-check-node-port", "31000"], HC),
        ([*LOCAL, "--port", "80::30004", "--health-check-node-port", "30004"], "own TCP nodePort"),
        ([*LOCAL, "--port", "80", "--health-check-node-port", "30000"], "held by Service"),
    ],
)
def test_bad_values_are_refused_naming_the_field_and_nothing_is_written(svc, store, args, named):
    svc("create", "default/other", "--type", "NodePort", "--port", "80")  # holds TCP/30000
    before = {kv.key: kv.value for kv in store.range("/")}
    assert named in svc("create", "default/web", *args, code=1)
    assert {kv.key: kv.value for kv in store.range("/")} == before

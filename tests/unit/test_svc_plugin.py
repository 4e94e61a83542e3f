"""pycni-svc's pure parsing and its handler on a real SqliteStore, over generated input.

Parsing: any ``args`` / CNI_ARGS give the record's fields or InvalidConfig (code 7) naming a
key, nothing else. The handler: over any sequence of ADD / DEL / GC of attachments (Pods that
reuse a name, other nodes' records, DELs without the Pod's CNI_ARGS), the store holds exactly
the records a simple model says: the last ADD of each key, until its own attachment's DEL or a
GC that does not list it.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni.spec.errors import CheckFailed, CNIError, InvalidConfig
from cni.spec.request import Env, Request
from cni.spec.result import canonical
from plugins.base import Faults
from plugins.svc.args import (
    calc_ips,
    parse_labels,
    parse_port_protocols,
    parse_ports,
    validate_identity,
)
from plugins.svc.plugin import SvcPlugin
from services.record import EndpointRecord
from store.keys import ENDPOINTS
from store.sqlite import SqliteStore

PREV = {
    "cniVersion": "1.1.0",
    "interfaces": [{"name": "veth1"}, {"name": "eth0", "sandbox": "/run/netns/p"}],
    "ips": [
        {"address": "10.22.0.5/24", "interface": 1},
        {"address": "fd22::5/64", "interface": 1},
        {"address": "10.99.0.1/24", "interface": 0},
    ],
}

texts = st.one_of(
    st.sampled_from(
        [
            "app",
            "web",
            "a.b/c",
            "Web_1",
            "",
            "-x",
            "x" * 70,
            "a=b",
            "k8s.io/name",
            "http",
            "8080",
            "TCP",
            "UDP",
            "ftp",
        ]
    ),
    st.text(max_size=8),
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 70000), texts),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)
    ),
    max_leaves=12,
)
label_items = st.fixed_dictionaries({"key": texts, "value": texts})
port_items = st.fixed_dictionaries(
    {"name": texts, "containerPort": st.integers(-1, 70000)}, optional={"protocol": texts}
)
cni_sections = st.fixed_dictionaries(
    {},
    optional={
        "labels": st.one_of(
            st.lists(label_items, max_size=3),
            st.dictionaries(texts, texts, max_size=3),
            json_values,
        ),
        "ports": st.one_of(st.lists(port_items, max_size=3), json_values),
    },
)
configs = st.one_of(
    st.just({}),
    st.builds(lambda c: {"args": {"cni": c}}, cni_sections),
    st.builds(lambda a: {"args": a}, json_values),
)
cni_args = st.dictionaries(
    st.sampled_from(["K8S_POD_NAMESPACE", "K8S_POD_NAME", "PYCNI_LABELS"]),
    st.one_of(texts, st.just("app:web,tier:front"), st.just("a:")),
)


def parse_all(config: dict, args: dict) -> tuple:
    return (validate_identity(args), parse_labels(config, args), parse_ports(config))


@settings(max_examples=400)
@given(configs, cni_args)
def test_any_args_give_record_fields_or_code_7_naming_the_key(config, args):
    try:
        (namespace, pod), labels, ports = parse_all(config, args)
    except InvalidConfig as err:
        assert err.code == 7
        assert err.msg.startswith("invalid ") and ("args" in err.msg or "CNI_ARGS" in err.msg)
        return
    record = EndpointRecord(namespace, pod, "eth0", (), labels, "n1", ports, "c1", "net")
    assert "/" not in namespace and "/" not in pod  # key segments stay segments
    again = EndpointRecord.from_bytes(record.key, record.to_bytes())
    assert again == record and json.loads(record.to_bytes())["ports"] == ports
    assert all(1 <= p <= 65535 for p in ports.values())


def test_the_accepted_shapes():
    config = {
        "args": {
            "cni": {
                "labels": [{"key": "app", "value": "web"}],
                "ports": [
                    {"name": "http", "containerPort": 8080, "protocol": "TCP"},
                    {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                ],
            }
        }
    }
    assert parse_labels(config, {}) == {"app": "web"}
    assert parse_labels({"args": {"cni": {"labels": {"app": "db"}}}}, {}) == {"app": "db"}
    assert parse_labels({}, {"PYCNI_LABELS": "app:web,tier:front"}) == {
        "app": "web",
        "tier": "front",
    }
    assert parse_ports(config) == {"http": 8080, "dns": 53}
    assert parse_port_protocols(config) == {"dns": "UDP"}  # TCP: left out
    assert calc_ips(PREV, "1.1.0", "eth0") == ("10.22.0.5", "fd22::5")
    with pytest.raises(InvalidConfig, match="args.cni.ports\\[1\\].name"):
        parse_ports({"args": {"cni": {"ports": [{"name": "a", "containerPort": 1}] * 2}}})
    with pytest.raises(InvalidConfig, match="K8S_POD_NAME"):
        validate_identity({"K8S_POD_NAMESPACE": "default"})


def request(
    command: str,
    cid: str,
    ifname: str = "eth0",
    pod: str | None = "p1",
    prev: dict | None = PREV,
    network: str = "net",
    labels: str = "app:web",
    **config,
) -> Request:
    args = (
        {"K8S_POD_NAMESPACE": "default", "K8S_POD_NAME": pod, "PYCNI_LABELS": labels}
        if pod
        else {}
    )
    conf = {"cniVersion": "1.1.0", "name": network, "type": "pycni-svc", **config}
    if prev is not None:
        conf["prevResult"] = prev
    return Request(Env(command, cid, "/run/netns/p", ifname, args), conf)


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(str(tmp_path / "store.db"))
    yield s
    s.close()


def plugin_on(store, node: str = "n1") -> SvcPlugin:
    return SvcPlugin(SimpleNamespace(store=store, node_name=node, faults=Faults(), netpol=None))


def stored(store) -> dict[str, EndpointRecord]:
    return {kv.key: EndpointRecord.from_bytes(kv.key, kv.value) for kv in store.range(ENDPOINTS)}


def test_add_returns_prev_result_and_check_names_differences(store):
    svc = plugin_on(store)
    assert svc.add(request("ADD", "c1")) == canonical(PREV, "1.1.0")  # prevResult, as it came
    record = stored(store)[f"{ENDPOINTS}default/p1/eth0"]
    assert (record.ips, record.labels, record.node, record.container_id, record.network) == (
        ("10.22.0.5", "fd22::5"),
        {"app": "web"},
        "n1",
        "c1",
        "net",
    )
    svc.check(request("CHECK", "c1"))
    svc.check(request("CHECK", "c1", prev=None))
    with pytest.raises(CheckFailed) as err:
        svc.check(request("CHECK", "c1", labels="app:db"))
    assert "labels" in err.value.details and "'app': 'db'" in err.value.details
    with pytest.raises(InvalidConfig, match="prevResult"):
        svc.add(request("ADD", "c2", prev=None))


@st.composite
def steps(draw):
    kind = draw(st.sampled_from(["ADD", "DEL", "DEL-noargs", "GC", "ADD-other-node"]))
    return (
        kind,
        draw(st.sampled_from(["c1", "c2", "c3"])),
        draw(st.sampled_from(["p1", "p2"])),
        draw(st.sampled_from(["eth0", "net1"])),
        draw(
            st.lists(
                st.sampled_from([("c1", "eth0"), ("c2", "eth0"), ("c3", ""), ("c1", "net1")]),
                max_size=3,
            )
        ),
    )


def model_step(model: dict, step: tuple) -> None:
    kind, cid, pod, ifname, valid = step
    key = f"{ENDPOINTS}default/{pod}/{ifname}"
    if kind.startswith("ADD"):
        model[key] = (cid, ifname, "n2" if kind == "ADD-other-node" else "n1")
    elif kind == "DEL":
        if model.get(key, ())[:2] == (cid, ifname):
            del model[key]
    elif kind == "DEL-noargs":
        for k in [k for k, v in model.items() if v[:2] == (cid, ifname)]:
            del model[k]
    else:
        keep = {(c, i) for c, i in valid}
        for k in [
            k
            for k, (c, i, n) in model.items()
            if n == "n1" and (c, i) not in keep and (c, "") not in keep
        ]:
            del model[k]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(steps(), max_size=12))
def test_the_store_holds_what_the_model_says(tmp_path_factory, sequence):
    store = SqliteStore(str(tmp_path_factory.mktemp("svc") / "store.db"))
    here, there, model = plugin_on(store, "n1"), plugin_on(store, "n2"), {}
    try:
        for step in sequence:
            kind, cid, pod, ifname, valid = step
            if kind == "GC":
                atts = [{"containerID": c, "ifname": i} for c, i in valid]
                here.gc(request("GC", "", "", None, None, **{"cni.dev/valid-attachments": atts}))
            elif kind == "DEL-noargs":
                here.delete(request("DEL", cid, ifname, None, None))
            else:
                plugin = there if kind == "ADD-other-node" else here
                getattr(plugin, "add" if kind.startswith("ADD") else "delete")(
                    request(kind[:3], cid, ifname, pod)
                )
            model_step(model, step)
            assert {
                k: (r.container_id, r.ifname, r.node) for k, r in stored(store).items()
            } == model
    finally:
        store.close()


def test_status_and_a_missing_record(store):
    svc = plugin_on(store)
    svc.status(request("STATUS", ""))
    with pytest.raises(CheckFailed, match="no endpoint record"):
        svc.check(request("CHECK", "c9"))
    svc.delete(request("DEL", "c9"))  # nothing there: success
    with pytest.raises(CNIError):
        svc.add(request("ADD", "c1", pod="Bad_Name"))

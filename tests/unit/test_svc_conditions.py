"""Endpoint conditions (ready, serving, terminating): the record codec, the selection rule
the proxy and the tracer share, and what the UDP conntrack cleanup counts as serving.

The rule is Kubernetes' (KEP-1669, kube-proxy's CategorizeEndpoints), written here again as
a reference from the records themselves: a bucket (all endpoints, or the node's own under a
Local policy) takes its ready endpoints; with none ready, its serving terminating ones; with
none of those, nothing — a reject when no usable endpoint exists anywhere, a drop when the
Local bucket is empty but others serve elsewhere. Generated clusters check the model's
backends, the tracer's verdict and the UDP serving sets against it."""

from __future__ import annotations

import ipaddress
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.command import Failed
from cli.svc import parse_pod
from cni.spec.errors import InvalidConfig
from plugins.svc.store import calc_kept_conditions
from services.ops.endpoint import validate_conditions
from services.proxy.conntrack import calc_udp_serving
from services.proxy.model import Backend, select_backends
from services.proxy.trace import explain
from services.proxy.view import Records, calc_model
from services.record import EndpointRecord, ServicePort, ServiceRecord, ServiceSettings
from store.base import KV
from store.codec import CorruptRecord, encode
from store.keys import SERVICES_META

CONDITIONS = st.fixed_dictionaries(
    {"ready": st.booleans(), "serving": st.booleans(), "terminating": st.booleans()}
)


def kv(key: str, value: bytes) -> KV:
    return KV(key, value, 1, 1)


@st.composite
def backends(draw) -> tuple[Backend, ...]:
    n = draw(st.integers(0, 6))
    return tuple(
        Backend(ipaddress.ip_address(f"10.0.0.{i + 2}"), 8080, "n1", True, draw(st.booleans()))
        for i in range(n)
    )


@given(backends())
def test_selection_is_the_ready_ones_else_the_rest(given_backends):
    chosen = select_backends(given_backends)
    ready = [b for b in given_backends if b.ready]
    assert set(chosen) <= set(given_backends)
    assert list(chosen) == (ready or list(given_backends))  # order kept: slots stay put
    assert bool(chosen) == bool(given_backends)


# --- the record codec ---


@given(
    CONDITIONS,
    st.dictionaries(
        st.sampled_from(["zone", "hints"]), st.integers(-9, 9) | st.text("ab", max_size=3)
    ),
)
def test_conditions_round_trip_and_unknown_fields_stay(conditions, extra):
    record = EndpointRecord("ns", "p", "eth0", ("10.0.0.2",), {"app": "a"}, "n1", **conditions)
    data = {**extra, **record.to_dict()}
    back = EndpointRecord.from_bytes(record.key, encode(data))
    assert back == record and dict(back.extra) == extra
    assert json.loads(back.to_bytes()) == data


@given(st.sampled_from([None, True, False]), st.sampled_from([None, True, False]))
def test_an_old_record_reads_ready_and_serving_as_kubernetes_reads_unset_ones(ready, serving):
    """Absent (a record from before conditions) or null: ready; serving as ready; not
    terminating."""
    data = {"namespace": "ns", "pod": "p", "ifname": "eth0", "ips": ["10.0.0.2"]}
    data |= {k: v for k, v in (("ready", ready), ("serving", serving)) if v is not None}
    back = EndpointRecord.from_bytes("k", encode(data))
    want_ready = True if ready is None else ready
    assert back.ready is want_ready
    assert back.serving is (want_ready if serving is None else serving)
    assert back.terminating is False


@pytest.mark.parametrize("field", EndpointRecord.CONDITIONS)
@pytest.mark.parametrize("value", ["yes", 1, 0, [], {}])
def test_a_condition_that_is_not_a_boolean_is_a_corrupt_record_naming_it(field, value):
    data = {"namespace": "ns", "pod": "p", "ifname": "eth0", field: value}
    with pytest.raises(CorruptRecord) as err:
        EndpointRecord.from_bytes("k", encode(data))
    assert field in str(err.value.details)


@given(CONDITIONS, st.booleans())
def test_a_repeated_add_keeps_its_attachments_conditions_and_a_new_one_starts_ready(
    conditions, same
):
    stored = EndpointRecord("ns", "p", "eth0", container_id="c1", network="n", **conditions)
    wanted = EndpointRecord("ns", "p", "eth0", container_id="c1" if same else "c2", network="n")
    kept = calc_kept_conditions(wanted, stored)
    expected = conditions if same else {"ready": True, "serving": True, "terminating": False}
    assert {c: getattr(kept, c) for c in EndpointRecord.CONDITIONS} == expected
    assert kept.container_id == wanted.container_id


# --- the model and the tracer against the reference rule ---

ENDPOINTS = st.lists(st.tuples(st.sampled_from(["n1", "n2"]), CONDITIONS), min_size=0, max_size=6)


def calc_records(eps: list, family: int, local: bool) -> tuple[Records, list[EndpointRecord]]:
    records = Records()
    vip, pods = ("10.96.0.5", "10.0.0.") if family == 4 else ("fd96::5", "fd00::")
    svc = ServiceRecord(
        "ns",
        "web",
        "NodePort",
        (ServicePort("dns", "UDP", 53, 5353, 30053),),
        (vip,),
        (),
        {"app": "web"},
        external_traffic_policy="Local" if local else "Cluster",
    )
    records.apply(kv(svc.key, svc.to_bytes()))
    cidr = "10.96.0.0/24" if family == 4 else "fd96::/112"
    records.apply(kv(SERVICES_META, ServiceSettings((cidr,)).to_bytes()))
    made = []
    for i, (node, conditions) in enumerate(eps):
        e = EndpointRecord(
            "ns", f"p{i}", "eth0", (f"{pods}{i + 2}",), {"app": "web"}, node, **conditions
        )
        records.apply(kv(e.key, e.to_bytes()))
        made.append(e)
    return records, made


def reference(bucket: list[EndpointRecord]) -> set[str]:
    ready = {e.ips[0] for e in bucket if e.ready}
    return ready or {e.ips[0] for e in bucket if e.serving and e.terminating}


@given(ENDPOINTS, st.sampled_from([4, 6]), st.booleans())
def test_model_and_tracer_choose_as_kubernetes_specifies(eps, family, local):
    records, made = calc_records(eps, family, local)
    model = calc_model(records, "n1", family, ["192.168.0.2" if family == 4 else "fd01::2"])
    (view,) = model.ports
    every = reference(made)
    mine = reference([e for e in made if e.node == "n1"])
    assert {str(b.ip) for b in view.calc_backends(False)} == every
    assert {str(b.ip) for b in view.calc_backends(True)} == (mine if local else every)
    usable = {e.ips[0] for e in made if e.ready or (e.serving and e.terminating)}
    serving = calc_udp_serving(model)
    assert all(ips == frozenset(usable) for ips in serving.values())  # terminating still serve
    vip = view.service.vips[0]
    node_ip = model.node.node_ips[0]
    client = ipaddress.ip_address("203.0.113.9" if family == 4 else "2001:db8::9")
    for dst, port, external, chosen in (
        (vip, 53, False, every),
        (node_ip, 30053, True, mine if local else every),
    ):
        answer = explain(model, model.node, client, 40000, dst, port, "udp")
        if chosen:
            assert answer.verdict == "dnat" and {c.ip for c in answer.choices} == chosen
            fallback = not any(e.ready for e in made if e.ips[0] in chosen)
            assert ("terminating" in answer.reason) == fallback
        else:
            dropped = external and local and bool(usable)
            assert answer.verdict == ("drop" if dropped else "reject"), answer


# --- the command's parsers ---


@given(st.text("ab/", max_size=6))
def test_a_pod_reference_parses_back_or_is_refused_naming_the_shape(text):
    try:
        namespace, pod = parse_pod(text)
    except Failed as err:
        assert "NAMESPACE/POD" in str(err)
        return
    assert f"{namespace}/{pod}" == text and namespace and pod and "/" not in pod


@given(
    st.dictionaries(
        st.sampled_from(["ready", "serving", "terminating", "Ready", "zone"]),
        st.booleans() | st.integers(0, 1) | st.none() | st.text(max_size=2),
        max_size=3,
    )
)
def test_conditions_are_booleans_of_known_names_or_code_7_naming_one(changes):
    try:
        wanted = validate_conditions(changes)
    except InvalidConfig as err:
        assert err.code == 7
        bad = [k for k, v in changes.items() if k not in EndpointRecord.CONDITIONS]
        bad += [k for k, v in changes.items() if not isinstance(v, bool)]
        assert (not changes and "no endpoint condition" in err.msg) or any(
            f"condition {k}" in err.msg for k in bad
        )
        return
    assert wanted == changes and changes

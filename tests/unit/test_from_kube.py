"""Services and EndpointSlices from the API server as the proxy's records (services/from_kube.py).

Objects are built with the official client's models and serialised as the API server sends
them, so their shapes are real. The generated cases check the conversion's invariants on any
shape a server could send (and on broken ones): a record or ValueError, never another error.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client as k

from services.from_kube import SERVICE_NAME, SLICE_PORT, service_record, slice_endpoints
from services.proxy.view import Records, calc_model
from services.selectors import calc_served_ports

API = k.ApiClient()


def wire(model: Any) -> dict:
    return API.sanitize_for_serialization(model)


def service(name: str = "web", **spec: Any) -> dict:
    spec.setdefault("cluster_ips", ["10.96.0.10"])
    spec.setdefault("ports", [k.V1ServicePort(name="http", port=80, target_port="http")])
    return wire(
        k.V1Service(
            api_version="v1",
            kind="Service",
            metadata=k.V1ObjectMeta(name=name, namespace="default", resource_version="5"),
            spec=k.V1ServiceSpec(**spec),
        )
    )


def endpoint_slice(
    name: str = "web-abc",
    service_name: str | None = "web",
    family: str = "IPv4",
    endpoints: list[k.V1Endpoint] | None = None,
    ports: list[k.DiscoveryV1EndpointPort] | None = None,
) -> dict:
    labels = {SERVICE_NAME: service_name} if service_name else {}
    return wire(
        k.V1EndpointSlice(
            api_version="discovery.k8s.io/v1",
            kind="EndpointSlice",
            metadata=k.V1ObjectMeta(name=name, namespace="default", labels=labels),
            address_type=family,
            endpoints=endpoints or [],
            ports=ports
            if ports is not None
            else [k.DiscoveryV1EndpointPort(name="http", port=8080)],
        )
    )


def endpoint(address: str, node: str = "n1", **conditions: bool | None) -> k.V1Endpoint:
    return k.V1Endpoint(
        addresses=[address],
        node_name=node,
        conditions=k.V1EndpointConditions(**conditions) if conditions else None,
        target_ref=k.V1ObjectReference(kind="Pod", name=f"pod-{address}", namespace="default"),
    )


def test_a_service_becomes_a_record_that_selects_its_slices_and_targets_their_ports() -> None:
    record = service_record(
        service(
            type="LoadBalancer",
            cluster_ips=["10.96.0.10", "fd00:96::10"],
            ports=[
                k.V1ServicePort(name="http", port=80, target_port=8080, node_port=30080),
                k.V1ServicePort(name="dns", port=53, protocol="UDP", node_port=30053),
            ],
            external_ips=["192.0.2.7"],
            session_affinity="ClientIP",
            session_affinity_config=k.V1SessionAffinityConfig(
                client_ip=k.V1ClientIPConfig(timeout_seconds=60)
            ),
            external_traffic_policy="Local",
            internal_traffic_policy="Local",
            health_check_node_port=31000,
            load_balancer_source_ranges=["198.51.100.0/24"],
        )
        | {"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.9"}, {"hostname": "x"}]}}}
    )
    assert record is not None
    assert (record.namespace, record.name, record.type) == ("default", "web", "LoadBalancer")
    assert record.selector == {SERVICE_NAME: "web"}
    assert record.cluster_ips == ("10.96.0.10", "fd00:96::10")
    assert [(p.name, p.protocol, p.port, p.target_port, p.node_port) for p in record.ports] == [
        ("http", "TCP", 80, SLICE_PORT + "http", 30080),
        ("dns", "UDP", 53, SLICE_PORT + "dns", 30053),
    ]
    assert record.external_ips == ("192.0.2.7",)
    assert (record.session_affinity, record.timeout_seconds) == ("ClientIP", 60)
    assert (record.external_traffic_policy, record.internal_traffic_policy) == ("Local", "Local")
    assert record.health_check_node_port == 31000
    assert record.load_balancer_ips == ("203.0.113.9",)
    assert record.load_balancer_source_ranges == ("198.51.100.0/24",)


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "ExternalName", "external_name": "example.com", "cluster_ips": None},
        {"cluster_ip": "None", "cluster_ips": ["None"]},
        {"cluster_ips": None},
    ],
    ids=["external-name", "headless", "no-cluster-ip"],
)
def test_services_kube_proxy_does_not_program_give_no_record(spec: dict) -> None:
    assert service_record(service(**spec)) is None


def test_slice_endpoints_keep_their_conditions_first_address_node_and_ports() -> None:
    found = dict(
        slice_endpoints(
            endpoint_slice(
                endpoints=[
                    endpoint("10.0.0.1"),
                    endpoint("10.0.0.2", "n2", ready=False, serving=True, terminating=True),
                    endpoint("10.0.0.3", ready=False),
                    k.V1Endpoint(addresses=["10.0.0.4", "10.0.0.5"]),
                ]
            )
        )
    )
    assert list(found) == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    first, terminating, not_ready, bare = (found[a] for a in found)
    assert (first.ready, first.serving, first.terminating, first.node) == (True, True, False, "n1")
    assert first.pod == "pod-10.0.0.1" and first.ips == ("10.0.0.1",)
    assert first.labels == {SERVICE_NAME: "web"} and first.ports == {SLICE_PORT + "http": 8080}
    assert (terminating.ready, terminating.serving, terminating.terminating) == (
        False,
        True,
        True,
    )
    assert terminating.usable and not not_ready.usable
    assert (not_ready.serving, not_ready.terminating) == (False, False)
    assert bare.ips == ("10.0.0.4",) and bare.node == "" and bare.pod == "web-abc-3"


@pytest.mark.parametrize(
    "obj",
    [
        endpoint_slice(service_name=None, endpoints=[endpoint("10.0.0.1")]),
        endpoint_slice(family="FQDN", endpoints=[endpoint("example.com")]),
    ],
    ids=["no-service-label", "fqdn"],
)
def test_slices_kube_proxy_ignores_give_no_endpoints(obj: dict) -> None:
    assert slice_endpoints(obj) == ()


def test_the_model_from_kube_records_balances_to_the_slices_ports() -> None:
    """Through the proxy's own model: the Service's port reaches the slice's port (the named
    targetPort the slice resolved), only for the slice's Service."""
    records = Records()
    records.put_service("k/web", service_record(service()))
    records.put_service("k/db", service_record(service("db", cluster_ips=["10.96.0.11"])))
    for address, record in slice_endpoints(
        endpoint_slice(endpoints=[endpoint("10.1.0.5"), endpoint("10.1.0.6", "n2")])
    ):
        records.put_endpoint(f"k/ep/{address}", record)
    model = calc_model(records, "n1", 4)
    web = next(v for v in model.ports if v.service.name == "web")
    db = next(v for v in model.ports if v.service.name == "db")
    assert [(str(b.ip), b.port, b.node, b.local) for b in web.backends] == [
        ("10.1.0.5", 8080, "n1", True),
        ("10.1.0.6", 8080, "n2", False),
    ]
    assert db.backends == ()


def test_a_slice_port_the_service_does_not_name_serves_nothing() -> None:
    record = service_record(service())
    assert record is not None
    (_, ep), *_ = slice_endpoints(
        endpoint_slice(
            endpoints=[endpoint("10.1.0.5")],
            ports=[k.DiscoveryV1EndpointPort(name="metrics", port=9090)],
        )
    )
    assert calc_served_ports(record, ep) == {}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70000) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


def mangled(base: dict) -> st.SearchStrategy[dict]:
    """``base`` with some of its keys (at any depth of spec/metadata) replaced by junk."""
    keys = st.sampled_from(
        ["spec", "metadata", "status", "ports", "endpoints", "addressType", "type"]
    )
    return st.dictionaries(keys, JSON, max_size=3).map(lambda junk: {**base, **junk})


@settings(max_examples=150, deadline=None)
@given(st.one_of(mangled(service()), JSON.filter(lambda v: isinstance(v, dict))))
def test_any_service_shape_is_a_record_none_or_value_error(obj: dict) -> None:
    try:
        record = service_record(obj)
    except ValueError:
        return
    if record is not None:
        assert record.selector == {SERVICE_NAME: record.name}
        assert all(p.target_port == SLICE_PORT + p.name for p in record.ports)
        assert all(0 < p.port < 65536 for p in record.ports)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        mangled(endpoint_slice(endpoints=[endpoint("10.0.0.1"), endpoint("10.0.0.2")])),
        JSON.filter(lambda v: isinstance(v, dict)),
    )
)
def test_any_slice_shape_gives_endpoints_of_its_service_or_value_error(obj: dict) -> None:
    try:
        found = slice_endpoints(obj)
    except ValueError:
        return
    addresses = [a for a, _ in found]
    assert len(addresses) == len(set(addresses))
    for address, record in found:
        assert record.ips == (address,)
        assert record.labels == {SERVICE_NAME: obj["metadata"]["labels"][SERVICE_NAME]}
        assert all(0 < p < 65536 for p in record.ports.values())

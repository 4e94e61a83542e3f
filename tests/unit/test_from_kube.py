"""Services and EndpointSlices from the API server as the proxy's records (services/from_kube.py).

Objects are built with the official client's models and serialised as the API server sends
them, so their shapes are real. The generated cases check the conversion's invariants on any
shape a server could send (and on broken ones): a record or ValueError, never another error.
"""

from __future__ import annotations

import copy
import sys
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client as k

from kube.reflector import UNREADABLE
from netpol.from_kube import Kept, namespace_labels
from services.from_kube import SERVICE_NAME, SLICE_PORT, service_record, slice_endpoints
from services.proxy.kube_source import ServiceSink, SliceSink
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


# --- the conversion against a reference read from the API types --------------------------
#: The values the generated objects draw from: few, so that addresses repeat within a slice
#: (the first endpoint of an address wins) and records share labels, nodes and namespaces.
ADDRESSES = st.sampled_from(["10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::1"])
CONDITION = st.none() | st.booleans()
NAMES = st.none() | st.sampled_from(["", "http", "dns"])


def api_endpoint() -> st.SearchStrategy[k.V1Endpoint]:
    return st.builds(
        k.V1Endpoint,
        addresses=st.lists(ADDRESSES, min_size=1, max_size=2),
        node_name=st.none() | st.sampled_from(["n1", "n2"]),
        conditions=st.none()
        | st.builds(
            k.V1EndpointConditions, ready=CONDITION, serving=CONDITION, terminating=CONDITION
        ),
        target_ref=st.none()
        | st.builds(k.V1ObjectReference, kind=st.just("Pod"), name=st.none() | st.just("p")),
    )


def api_slice() -> st.SearchStrategy[k.V1EndpointSlice]:
    port = st.builds(k.DiscoveryV1EndpointPort, name=NAMES, port=st.none() | st.integers(1, 65535))
    return st.builds(
        k.V1EndpointSlice,
        address_type=st.sampled_from(["IPv4", "IPv6", "FQDN"]),
        metadata=st.builds(
            k.V1ObjectMeta,
            name=st.just("web-abc"),
            namespace=st.sampled_from(["default", "kube-system"]),
            labels=st.sampled_from([{SERVICE_NAME: "web"}, {SERVICE_NAME: "db", "x": "y"}, {}]),
        ),
        endpoints=st.lists(api_endpoint(), max_size=5),
        ports=st.none() | st.lists(port, max_size=3),
    )


def reference_endpoints(model: Any) -> dict[str, tuple]:
    """A slice's endpoints as the API types describe them: the first endpoint of an address
    wins, an endpoint's first address is its address, an unset condition is ready=true,
    serving=ready, terminating=false; a slice of no Service or of FQDNs has none."""
    meta = model.metadata
    service = (meta.labels or {}).get(SERVICE_NAME)
    if not service or model.address_type == "FQDN":
        return {}
    ports = {SLICE_PORT + (p.name or ""): p.port for p in model.ports or [] if p.port}
    found: dict[str, tuple] = {}
    for index, e in enumerate(model.endpoints):
        c = e.conditions or k.V1EndpointConditions()
        ready = c.ready is not False
        pod = (e.target_ref.name if e.target_ref else None) or f"{meta.name}-{index}"
        found.setdefault(
            e.addresses[0],
            (meta.namespace, pod, meta.name, (e.addresses[0],), {SERVICE_NAME: service})
            + (e.node_name or "", ports, ready, ready if c.serving is None else c.serving)
            + (bool(c.terminating),),
        )
    return found


def fields_of(record: Any) -> tuple:
    return (record.namespace, record.pod, record.ifname, record.ips, dict(record.labels)) + (
        record.node,
        dict(record.ports),
        record.ready,
        record.serving,
        record.terminating,
    )


@settings(max_examples=200, deadline=None)
@given(api_slice())
def test_generated_slices_give_the_endpoints_the_api_types_describe(model: Any) -> None:
    found = slice_endpoints(wire(model))
    assert {a: fields_of(r) for a, r in found} == reference_endpoints(model)
    assert [a for a, _ in found] == list(reference_endpoints(model))
    for _, record in found:  # held as the store's records are: shared, interned, no extras
        assert record.labels is found[0][1].labels and record.ports is found[0][1].ports
        assert record.extra == {} and record.port_protocols == {}
        assert record.node is sys.intern(record.node)


def api_service() -> st.SearchStrategy[k.V1Service]:
    port = st.builds(
        k.V1ServicePort,
        name=NAMES,
        protocol=st.none() | st.sampled_from(["TCP", "UDP"]),
        port=st.integers(1, 65535),
        node_port=st.none() | st.integers(30000, 32767),
    )
    client_ip = st.builds(k.V1ClientIPConfig, timeout_seconds=st.none() | st.just(60))
    affinity = st.builds(k.V1SessionAffinityConfig, client_ip=st.none() | client_ip)
    kinds = ["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"]
    spec = st.builds(
        k.V1ServiceSpec,
        type=st.none() | st.sampled_from(kinds),
        cluster_ip=st.none() | st.sampled_from(["10.96.0.1", "None"]),
        cluster_ips=st.none() | st.sampled_from([["10.96.0.1", "fd00:96::1"], ["None"], []]),
        ports=st.none() | st.lists(port, max_size=3),
        external_ips=st.none() | st.just(["192.0.2.7"]),
        session_affinity=st.none() | st.sampled_from(["None", "ClientIP"]),
        session_affinity_config=st.none() | affinity,
        external_traffic_policy=st.none() | st.sampled_from(["Cluster", "Local"]),
        internal_traffic_policy=st.none() | st.sampled_from(["Cluster", "Local"]),
        health_check_node_port=st.none() | st.just(31000),
        load_balancer_source_ranges=st.none() | st.just(["198.51.100.0/24"]),
    )
    ingress = st.lists(
        st.builds(k.V1LoadBalancerIngress, ip=st.none() | st.just("203.0.113.9")), max_size=2
    )
    return st.builds(
        k.V1Service,
        metadata=st.builds(
            k.V1ObjectMeta, name=st.just("web"), namespace=st.sampled_from(["a", "b"])
        ),
        spec=spec,
        status=st.none()
        | st.builds(
            k.V1ServiceStatus,
            load_balancer=st.builds(k.V1LoadBalancerStatus, ingress=st.none() | ingress),
        ),
    )


def reference_service(model: Any) -> tuple | None:
    """A Service as the API types describe it, or None for what kube-proxy does not program
    (ExternalName, headless, no ClusterIP)."""
    spec, meta = model.spec, model.metadata
    ips = [ip for ip in (spec.cluster_ips or [spec.cluster_ip]) if ip]
    if spec.type == "ExternalName" or not ips or "None" in ips:
        return None
    affinity = spec.session_affinity_config
    timeout = affinity and affinity.client_ip and affinity.client_ip.timeout_seconds
    balancer = model.status and model.status.load_balancer
    ports = [
        (p.name or "", p.protocol or "TCP", p.port, SLICE_PORT + (p.name or ""), p.node_port or 0)
        for p in spec.ports or []
    ]
    return (meta.namespace, meta.name, spec.type or "ClusterIP", ports, tuple(ips)) + (
        tuple(spec.external_ips or ()),
        {SERVICE_NAME: meta.name},
        spec.session_affinity or "None",
        timeout or 10800,
        spec.external_traffic_policy or "Cluster",
        spec.internal_traffic_policy or "Cluster",
        spec.health_check_node_port or 0,
        tuple(i.ip for i in (balancer and balancer.ingress) or [] if i.ip),
        tuple(spec.load_balancer_source_ranges or ()),
    )


@settings(max_examples=200, deadline=None)
@given(api_service())
def test_generated_services_give_the_record_the_api_types_describe(model: Any) -> None:
    record = service_record(wire(model))
    if record is None:
        assert reference_service(model) is None
        return
    ports = [(p.name, p.protocol, p.port, p.target_port, p.node_port) for p in record.ports]
    assert (record.namespace, record.name, record.type, ports, record.cluster_ips) + (
        record.external_ips,
        dict(record.selector),
        record.session_affinity,
        record.timeout_seconds,
        record.external_traffic_policy,
        record.internal_traffic_policy,
        record.health_check_node_port,
        record.load_balancer_ips,
        record.load_balancer_source_ranges,
    ) == reference_service(model)
    assert record.extra == {} and all(p.extra == {} for p in record.ports)
    assert record.namespace is sys.intern(record.namespace)


def test_a_services_endpoints_share_its_selector_and_slices_their_ports() -> None:
    """One labels object for a Service and all its endpoints, as the store's records have;
    one ports object for the slices that name the same ports."""
    record = service_record(service())
    assert record is not None
    found = slice_endpoints(endpoint_slice(endpoints=[endpoint("10.0.0.1"), endpoint("10.0.0.2")]))
    assert all(r.labels is record.selector for _, r in found)
    db = endpoint_slice("db-x", "db", endpoints=[endpoint("10.0.1.1")])
    (_, other), *_ = slice_endpoints(db)
    assert other.ports is found[0][1].ports and other.ports == {SLICE_PORT + "http": 8080}


# --- what cannot be read: a ValueError naming the field, the object skipped ---------------
GOOD_SLICE = endpoint_slice(endpoints=[endpoint("10.0.0.1"), endpoint("10.0.0.2")])


def slice_with(path: tuple[Any, ...], value: Any) -> dict:
    obj = copy.deepcopy(GOOD_SLICE)
    held = obj
    for step in path[:-1]:
        held = held[step]
    held[path[-1]] = value
    return obj


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        (("metadata",), [], "metadata is not an object"),
        (("metadata", "labels"), "x", "labels is not an object"),
        (("metadata", "namespace"), "", "metadata.namespace is missing"),
        (("metadata", "name"), 5, "metadata.name is missing"),
        (("ports",), {}, "ports is not a list"),
        (("ports", 0, "port"), 0, "port 0 is not a port number"),
        (("ports", 0, "port"), True, "port True is not a port number"),
        (("endpoints",), "x", "endpoints is not a list"),
        (("endpoints", 1, "addresses"), "10.0.0.3", "addresses is not a list"),
        (("endpoints", 0, "conditions"), [], "conditions is not an object"),
        (("endpoints", 1, "targetRef"), "pod", "targetRef is not an object"),
        # the second endpoint of an address is not kept, but what it holds is still read
        (("endpoints", 1), {"addresses": ["10.0.0.1"], "targetRef": 1}, "targetRef is not"),
    ],
)
def test_a_slice_field_of_the_wrong_type_is_a_value_error_naming_it(
    path: tuple[Any, ...], value: Any, error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        slice_endpoints(slice_with(path, value))


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"ports": [{"port": 70000}]}, ValueError),
        ({"ports": ["http"]}, ValueError),
        ({"ports": {}}, ValueError),
        ({"externalIPs": "x"}, ValueError),
        ({"sessionAffinityConfig": {"clientIP": {"timeoutSeconds": "x"}}}, ValueError),
        ({"healthCheckNodePort": [1]}, TypeError),
    ],
)
def test_a_service_field_of_the_wrong_type_is_an_error_the_reflector_skips(
    spec: dict, error: type[Exception]
) -> None:
    obj = service()
    obj["spec"].update(spec)
    with pytest.raises(error):
        service_record(obj)
    assert issubclass(error, UNREADABLE)


def test_the_slice_sink_parses_each_address_once_and_skips_a_slice_with_a_bad_one() -> None:
    records = Records()
    records.put_service("k/web", service_record(service()))
    records.put_service("k/db", service_record(service("db", cluster_ips=["10.96.0.11"])))
    records.take_dirty()
    sink = SliceSink(records, threading.Lock(), threading.Event())
    obj = endpoint_slice(endpoints=[endpoint("10.1.0.5"), endpoint("fd00::6", "n2")])
    sink.replace({"default/web-abc": sink.convert(obj)})
    assert records.take_dirty() == {"k/web"}  # the slice's Service, not the other one
    assert {k: r.ips for k, r in records.endpoints.items()} == {
        "k8s:endpoints/default/web-abc/10.1.0.5": ("10.1.0.5",),
        "k8s:endpoints/default/web-abc/fd00::6": ("fd00::6",),
    }
    assert {k: tuple(map(str, a)) for k, a in records.addresses.items()} == {
        k: r.ips for k, r in records.endpoints.items()
    }
    with pytest.raises(ValueError, match="not an IP address"):
        sink.convert(endpoint_slice(endpoints=[endpoint("10.1.0.5"), endpoint("10.1.0.300")]))
    sink.apply("default/web-abc", None)
    assert not records.endpoints and not records.addresses and records.take_dirty() == {"k/web"}


def test_every_sink_wakes_its_consumer_when_its_kind_is_listed() -> None:
    """A consumer programs nothing before every kind is listed, and a reflector reports its
    kind listed after handing the list to ``replace``: each sink's ``listed`` wakes the
    consumer again, so its first pass does not wait for a poll."""
    records, lock = Records(), threading.Lock()
    for sink_type in (ServiceSink, SliceSink):
        wake = threading.Event()
        sink = sink_type(records, lock, wake)
        sink.replace({})
        wake.clear()
        sink.listed()
        assert wake.is_set()
    changes: list[str] = []
    kept = Kept(namespace_labels, lock, lambda: changes.append("changed"))
    kept.replace({})
    kept.listed()
    assert changes == ["changed", "changed"]

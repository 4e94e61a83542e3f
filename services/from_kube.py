"""Kubernetes Services and EndpointSlices as the records the proxy reads (pure).

The proxy's model (``services/proxy/view.py``) picks a Service's endpoints by selector and a
port's target by name. A Service from the API server becomes a ``ServiceRecord`` whose
selector is the label every EndpointSlice of the Service carries,
``kubernetes.io/service-name: <name>``, and whose ports target the EndpointSlice port of the same
name (``SLICE_PORT`` + name: an EndpointSlice names its ports after the Service's); each
endpoint of a slice becomes an ``EndpointRecord`` with that label, its node, its conditions
and the slice's ports. So the endpoints are exactly those the EndpointSlices list (a Service
without a selector included: its slices are someone else's, as in Kubernetes), and the
targetPort a slice resolved (a named container port) is used as resolved.

As kube-proxy does: an ExternalName or headless Service (clusterIP ``None``) programs nothing;
an endpoint's first address is its address; a condition the API leaves out means ready=true,
serving=ready, terminating=false; an FQDN slice is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from sys import intern
from typing import Any

from kube.fields import entries, section
from services.record import (
    DEFAULT_AFFINITY_TIMEOUT,
    EMPTY,
    EndpointRecord,
    ServicePort,
    ServiceRecord,
    shared_labels,
    shared_ports,
)

SERVICE_NAME = "kubernetes.io/service-name"  # the label on every slice of a Service
SLICE_PORT = "endpointslice:"  # + a Service port's name: the slice port of that name
PROGRAMMED_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
SLICE_FAMILIES = ("IPv4", "IPv6")


def service_record(obj: Mapping[str, Any]) -> ServiceRecord | None:
    """The record of a Service object (None: a kind the proxy does not program). Its repeated
    strings are interned and its selector shared with its endpoints' labels, as the store's
    records are (``services/record.py``): what a pycnid fed by the API server holds is what one
    fed by the store holds."""
    meta, spec = section(obj, "metadata"), section(obj, "spec")
    kind = str(spec.get("type") or "ClusterIP")
    ips = [str(ip) for ip in (spec.get("clusterIPs") or [spec.get("clusterIP")]) if ip]
    if kind not in PROGRAMMED_TYPES or not ips or "None" in ips:
        return None
    affinity = section(section(spec, "sessionAffinityConfig"), "clientIP")
    ingress = section(obj, "status").get("loadBalancer") or {}
    namespace, name = _text(meta, "namespace"), _text(meta, "name")
    return ServiceRecord(
        namespace=intern(namespace),
        name=name,
        type=intern(kind),
        ports=tuple(_service_port(p) for p in entries(spec, "ports")),
        cluster_ips=tuple(ips),
        external_ips=tuple(map(str, entries(spec, "externalIPs"))),
        selector=shared_labels({SERVICE_NAME: name}),
        session_affinity=intern(str(spec.get("sessionAffinity") or "None")),
        timeout_seconds=int(affinity.get("timeoutSeconds") or DEFAULT_AFFINITY_TIMEOUT),
        external_traffic_policy=intern(str(spec.get("externalTrafficPolicy") or "Cluster")),
        internal_traffic_policy=intern(str(spec.get("internalTrafficPolicy") or "Cluster")),
        health_check_node_port=int(spec.get("healthCheckNodePort") or 0),
        load_balancer_ips=tuple(
            str(i["ip"])
            for i in entries(ingress, "ingress")
            if isinstance(i, dict) and i.get("ip")
        ),
        load_balancer_source_ranges=tuple(map(str, entries(spec, "loadBalancerSourceRanges"))),
        extra=EMPTY,
    )


def _service_port(data: Any) -> ServicePort:
    if not isinstance(data, dict):
        raise ValueError(f"a Service port is not an object: {data!r}")
    name = intern(str(data.get("name") or ""))
    return ServicePort(
        name,
        intern(str(data.get("protocol") or "TCP")),
        _port(data.get("port"), "port"),
        intern(SLICE_PORT + name),
        int(data.get("nodePort") or 0),
        EMPTY,
    )


def slice_endpoints(obj: Mapping[str, Any]) -> tuple[tuple[str, EndpointRecord], ...]:
    """(the endpoint's address, its record) for each endpoint of an EndpointSlice; none for a
    slice of no Service or of FQDNs. The endpoints of a slice share its labels (the Service's
    selector: ``shared_labels``) and ports; namespaces and node names are interned."""
    meta = section(obj, "metadata")
    service = section(meta, "labels").get(SERVICE_NAME)
    if not service or obj.get("addressType") not in SLICE_FAMILIES:
        return ()
    namespace, name = intern(_text(meta, "namespace")), _text(meta, "name")
    ports = _slice_ports(obj)
    labels = shared_labels({SERVICE_NAME: str(service)})
    found: dict[str, EndpointRecord] = {}
    for index, endpoint in enumerate(entries(obj, "endpoints")):
        address = _first_address(endpoint)
        if address is None:
            continue
        conditions, target = section(endpoint, "conditions"), section(endpoint, "targetRef")
        if address in found:  # read as the first was (a bad field is the slice's error)
            continue
        ready = conditions.get("ready") is not False
        found[address] = EndpointRecord(
            namespace,
            str(target.get("name") or f"{name}-{index}"),
            name,  # the slice: an endpoint record's ifname, what tells two apart
            (address,),
            labels,
            intern(str(endpoint.get("nodeName") or "")),
            ports,
            extra=EMPTY,
            ready=ready,
            serving=_flag(conditions, "serving", ready),
            terminating=_flag(conditions, "terminating", False),
            port_protocols=EMPTY,
        )
    return tuple(found.items())


def _slice_ports(obj: Mapping[str, Any]) -> Mapping[str, int]:
    """{``SLICE_PORT`` + name: port} of a slice's ports that have a port number (one object
    for every slice that has the same: ``shared_ports``)."""
    ports: dict[str, int] = {}
    for p in entries(obj, "ports"):
        if isinstance(p, dict) and p.get("port") is not None:
            ports[intern(SLICE_PORT + str(p.get("name") or ""))] = _port(p.get("port"), "port")
    return shared_ports(ports)


def _first_address(endpoint: Any) -> str | None:
    """An endpoint's first address (None: not an object, or no address)."""
    if not isinstance(endpoint, dict):
        return None
    addresses = entries(endpoint, "addresses")
    return str(addresses[0]) if addresses else None


def _flag(conditions: Mapping[str, Any], name: str, default: bool) -> bool:
    value = conditions.get(name)
    return default if value is None else bool(value)


def _port(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ValueError(f"{name} {value!r} is not a port number")
    return value


def _text(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"metadata.{key} is missing")
    return value

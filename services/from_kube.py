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
from typing import Any

from kube.fields import entries, section
from services.record import (
    DEFAULT_AFFINITY_TIMEOUT,
    EndpointRecord,
    ServicePort,
    ServiceRecord,
)

SERVICE_NAME = "kubernetes.io/service-name"  # the label on every slice of a Service
SLICE_PORT = "endpointslice:"  # + a Service port's name: the slice port of that name
PROGRAMMED_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
SLICE_FAMILIES = ("IPv4", "IPv6")


def service_record(obj: Mapping[str, Any]) -> ServiceRecord | None:
    """The record of a Service object (None: a kind the proxy does not program)."""
    meta, spec = section(obj, "metadata"), section(obj, "spec")
    kind = str(spec.get("type") or "ClusterIP")
    ips = [str(ip) for ip in (spec.get("clusterIPs") or [spec.get("clusterIP")]) if ip]
    if kind not in PROGRAMMED_TYPES or not ips or "None" in ips:
        return None
    affinity = section(section(spec, "sessionAffinityConfig"), "clientIP")
    ingress = section(obj, "status").get("loadBalancer") or {}
    return ServiceRecord(
        namespace=_text(meta, "namespace"),
        name=_text(meta, "name"),
        type=kind,
        ports=tuple(_service_port(p) for p in entries(spec, "ports")),
        cluster_ips=tuple(ips),
        external_ips=tuple(map(str, entries(spec, "externalIPs"))),
        selector={SERVICE_NAME: _text(meta, "name")},
        session_affinity=str(spec.get("sessionAffinity") or "None"),
        timeout_seconds=int(affinity.get("timeoutSeconds") or DEFAULT_AFFINITY_TIMEOUT),
        external_traffic_policy=str(spec.get("externalTrafficPolicy") or "Cluster"),
        internal_traffic_policy=str(spec.get("internalTrafficPolicy") or "Cluster"),
        health_check_node_port=int(spec.get("healthCheckNodePort") or 0),
        load_balancer_ips=tuple(
            str(i["ip"])
            for i in entries(ingress, "ingress")
            if isinstance(i, dict) and i.get("ip")
        ),
        load_balancer_source_ranges=tuple(map(str, entries(spec, "loadBalancerSourceRanges"))),
    )


def _service_port(data: Any) -> ServicePort:
    if not isinstance(data, dict):
        raise ValueError(f"a Service port is not an object: {data!r}")
    name = str(data.get("name") or "")
    return ServicePort(
        name,
        str(data.get("protocol") or "TCP"),
        _port(data.get("port"), "port"),
        SLICE_PORT + name,
        int(data.get("nodePort") or 0),
    )


def slice_endpoints(obj: Mapping[str, Any]) -> tuple[tuple[str, EndpointRecord], ...]:
    """(the endpoint's address, its record) for each endpoint of an EndpointSlice; none for a
    slice of no Service or of FQDNs."""
    meta = section(obj, "metadata")
    service = section(meta, "labels").get(SERVICE_NAME)
    if not service or obj.get("addressType") not in SLICE_FAMILIES:
        return ()
    namespace, name = _text(meta, "namespace"), _text(meta, "name")
    ports = {
        SLICE_PORT + str(p.get("name") or ""): _port(p.get("port"), "port")
        for p in entries(obj, "ports")
        if isinstance(p, dict) and p.get("port") is not None
    }
    found: dict[str, EndpointRecord] = {}
    for index, endpoint in enumerate(entries(obj, "endpoints")):
        if not isinstance(endpoint, dict) or not entries(endpoint, "addresses"):
            continue
        address = str(entries(endpoint, "addresses")[0])
        conditions = section(endpoint, "conditions")
        ready = conditions.get("ready") is not False
        target = section(endpoint, "targetRef")
        found.setdefault(
            address,
            EndpointRecord(
                namespace,
                str(target.get("name") or f"{name}-{index}"),
                name,  # the slice: an endpoint record's ifname, what tells two apart
                (address,),
                {SERVICE_NAME: str(service)},
                str(endpoint.get("nodeName") or ""),
                ports,
                ready=ready,
                serving=_flag(conditions, "serving", ready),
                terminating=_flag(conditions, "terminating", False),
            ),
        )
    return tuple(found.items())


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

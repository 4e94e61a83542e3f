"""Which endpoints serve a Service, and on which port (pure).

An endpoint serves a Service when its labels hold every pair of the Service's selector; a
Service without a selector has no endpoints from Pods (as in Kubernetes: its endpoints are
someone else's business). A targetPort by name is the endpoint's named container port: an
endpoint that does not name it does not serve that port (Kubernetes does the same).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from services.record import EndpointRecord, ServicePort, ServiceRecord


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def calc_target(port: ServicePort, endpoint: EndpointRecord) -> int | None:
    """The endpoint's port for ``port`` (None: it does not serve it)."""
    if isinstance(port.target_port, int):
        return port.target_port
    return endpoint.ports.get(port.target_port)


def calc_endpoints(
    service: ServiceRecord, endpoints: Iterable[EndpointRecord]
) -> list[tuple[EndpointRecord, dict]]:
    """The endpoints in the Service's namespace that its selector picks, each with
    {service port name or number: the endpoint's port} for the ports it serves."""
    return [
        (endpoint, calc_served_ports(service, endpoint))
        for endpoint in endpoints
        if endpoint.namespace == service.namespace and matches(service.selector, endpoint.labels)
    ]


def calc_served_ports(service: ServiceRecord, endpoint: EndpointRecord) -> dict[str, int]:
    """{service port name or number: the endpoint's port} for the ports it serves."""
    return {
        p.name or str(p.port): t
        for p in service.ports
        if (t := calc_target(p, endpoint)) is not None
    }

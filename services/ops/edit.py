"""`pycni svc`'s behaviour: the cluster's service settings, and Services written, read and
matched to their endpoints (``services``: records, validation, allocation, selectors).

Every document returned is what ``--output json`` prints. A change (``change_service``) is a
partial spec: the fields it names replace the Service's, the rest stay; ports it lists keep
the nodePort of the old port of the same name and protocol (or number and protocol) unless
they name one, a Service becoming ClusterIP drops its nodePorts, one leaving
externalTrafficPolicy Local its healthCheckNodePort, one leaving LoadBalancer its
loadBalancerIPs and source ranges (unless the change names them), and the clusterIPs stay
unless it names them. Settings that would strand a Service's VIP or nodePort are refused.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

from cni.spec.errors import InvalidConfig
from services.allocate import commit, create_service, read_service, remove_service, update_service
from services.record import (
    EndpointRecord,
    ServiceRecord,
    ServiceSettings,
    endpoints_prefix,
    service_key,
    wants_health_check,
)
from services.selectors import calc_endpoints
from services.validate import NODE_PORT_TYPES, validate_settings
from store.base import KV, Compare, Put, Store
from store.cas import LOST, Lost
from store.codec import CorruptRecord
from store.keys import SERVICES, SERVICES_META


def calc_stranded(settings: ServiceSettings, services: list[ServiceRecord]) -> str | None:
    """Why ``settings`` would leave a Service's VIP or nodePort outside them (None: fine)."""
    nets = [ipaddress.ip_network(c) for c in settings.cidrs]
    low, high = settings.node_port_range
    for svc in services:
        for ip in svc.cluster_ips:
            if not any(ipaddress.ip_address(ip) in n for n in nets):
                return f"Service {svc.ref} holds clusterIP {ip}, outside the new CIDRs"
        for port in svc.ports:
            if port.node_port and not low <= port.node_port <= high:
                return f"Service {svc.ref} holds nodePort {port.node_port}, outside the range"
    return None


def set_settings(store: Store, cidrs: list[str], node_port_range: str) -> dict:
    """Write the service settings (compared against the revision read: a create racing this
    compares it too, so it either sees the new settings or makes this one retry)."""
    settings = validate_settings(cidrs, node_port_range)

    def attempt() -> ServiceSettings | Lost:
        old = store.get(SERVICES_META)
        stranded = calc_stranded(settings, list_records(store))
        if stranded:
            raise InvalidConfig(f"invalid service settings: {stranded}")
        extra = read_extra(old)
        new = ServiceSettings(settings.cidrs, settings.node_port_range, extra)
        done = store.txn(
            [Compare(SERVICES_META, old.mod_revision if old else 0)],
            [Put(SERVICES_META, new.to_bytes())],
        )
        return new if done.succeeded else LOST

    return {"settings": commit(store, attempt).to_dict()}


def show_settings(store: Store) -> dict:
    kv = store.get(SERVICES_META)
    return {"settings": ServiceSettings.from_bytes(kv.key, kv.value).to_dict() if kv else None}


def create(store: Store, spec: Mapping[str, Any]) -> dict:
    return {"service": create_service(store, dict(spec)).to_dict()}


def calc_kept_ports(old: list[dict], new: list, node_ports: bool) -> list:
    """The new ports, each keeping the nodePort of its old twin unless it names one."""
    if not node_ports:
        return [
            {k: v for k, v in p.items() if k != "nodePort"} if isinstance(p, dict) else p
            for p in new
        ]
    by_name = {(p.get("name"), p.get("protocol")): p.get("nodePort") for p in old}
    by_port = {(p.get("port"), p.get("protocol")): p.get("nodePort") for p in old}
    kept = []
    for port in new:
        if isinstance(port, dict) and not port.get("nodePort"):
            proto = port.get("protocol", "TCP")
            twin = by_name.get((port.get("name"), proto)) if port.get("name") else None
            twin = twin or by_port.get((port.get("port"), proto))
            port = {**port, "nodePort": twin} if twin else port
        kept.append(port)
    return kept


def calc_changed(spec: dict, changes: Mapping[str, Any]) -> dict:
    """The spec ``changes`` makes of the Service's current ``spec``."""
    new = {**spec, **changes}
    if changes.get("sessionAffinity", "ClientIP") != "ClientIP":
        new.pop("timeoutSeconds", None)
    ports = new.get("ports")
    if isinstance(ports, list):
        new["ports"] = calc_kept_ports(spec["ports"], ports, new.get("type") in NODE_PORT_TYPES)
    if "healthCheckNodePort" not in changes and not wants_health_check(
        new.get("type"), new.get("externalTrafficPolicy")
    ):
        new.pop("healthCheckNodePort", None)  # freed when the change leaves ETP Local
    if new.get("type") != "LoadBalancer":
        for field in ("loadBalancerIPs", "loadBalancerSourceRanges"):
            if field not in changes:
                new.pop(field, None)
    return new


def change(store: Store, namespace: str, name: str, changes: Mapping[str, Any]) -> dict:
    for field in ("namespace", "name"):
        if field in changes and changes[field] != {"namespace": namespace, "name": name}[field]:
            raise InvalidConfig(f"invalid Service field {field}: a Service cannot be renamed")
    record = update_service(
        store, service_key(namespace, name), lambda spec: calc_changed(spec, changes)
    )
    return {"service": record.to_dict()}


def remove(store: Store, namespace: str, name: str) -> dict:
    record = remove_service(store, service_key(namespace, name))
    return {
        "removed": record.ref,
        "freed": {
            "clusterIPs": list(record.cluster_ips),
            "nodePorts": [f"{p.protocol}/{p.node_port}" for p in record.ports if p.node_port]
            + [f"TCP/{hc}" for hc in [record.health_check_node_port] if hc],
        },
    }


def read_extra(kv: KV | None) -> dict:
    """The unknown fields of the settings kept across a rewrite (none of an unreadable
    record: rewriting it is how it is repaired)."""
    try:
        return dict(ServiceSettings.from_bytes(kv.key, kv.value).extra) if kv else {}
    except CorruptRecord:
        return {}


def list_records(store: Store) -> list[ServiceRecord]:
    """The readable Services (an unreadable one is listed by ``list_services`` apart, and
    ``pycni svc rm`` removes it)."""
    return read_records(store)[0]


def read_records(store: Store) -> tuple[list[ServiceRecord], list[str]]:
    records, unreadable = [], []
    for kv in store.range(SERVICES):
        try:
            records.append(ServiceRecord.from_bytes(kv.key, kv.value))
        except CorruptRecord:
            unreadable.append(kv.key)
    return records, unreadable


def list_services(store: Store) -> dict:
    records, unreadable = read_records(store)
    return {"services": [r.to_dict() for r in records], "unreadable": unreadable}


def show(store: Store, namespace: str, name: str) -> dict:
    record, _ = read_service(store, service_key(namespace, name))
    return {"service": record.to_dict(), "endpointCount": len(matched(store, record))}


def matched(store: Store, record: ServiceRecord) -> list[tuple[EndpointRecord, dict]]:
    endpoints = [
        EndpointRecord.from_bytes(kv.key, kv.value)
        for kv in store.range(endpoints_prefix(record.namespace))
    ]
    return calc_endpoints(record, endpoints)


def endpoints(store: Store, namespace: str, name: str) -> dict:
    """The endpoints the Service's selector picks, with the ports each one serves and its
    conditions."""
    record, _ = read_service(store, service_key(namespace, name))
    return render_endpoints_doc(record, matched(store, record))


def render_endpoints_doc(
    record: ServiceRecord, found: Iterable[tuple[EndpointRecord, dict]]
) -> dict:
    return {
        "service": record.ref,
        "selector": dict(record.selector),
        "endpoints": [
            {
                "namespace": e.namespace,
                "pod": e.pod,
                "ifname": e.ifname,
                "ips": list(e.ips),
                "node": e.node,
                "ports": ports,
                "ready": e.ready,
                "serving": e.serving,
                "terminating": e.terminating,
            }
            for e, ports in found
        ],
    }

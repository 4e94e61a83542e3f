"""The store's Service records as the proxy's model for one node and one family (pure).

``Records`` is what the proxy keeps from the store (services, endpoints, cluster pools, service
settings, node records), fed by watch events or a re-read; ``calc_model`` turns it into the
``ProxyModel`` the renderer and the tracer read. The proxy in pycnid and ``pycni svc trace``
both call ``calc_model``, so the tracer explains the very table a node programs. A record that
cannot be read, or a Service the model refuses, is skipped (and logged once by the caller's
``Records``): one bad record must not take every other Service down.
"""
from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass, field
from typing import Iterable

from cni.spec.errors import CNIError
from ipam.nodes.record import NodeRecord
from ipam.records import (ENDPOINTS, NODES, POOLS, SERVICES, SERVICES_META, CorruptRecord,
                          decode)
from ipam.services.record import EndpointRecord, ServiceRecord, ServiceSettings
from ipam.services.selectors import calc_endpoints
from ipam.store.base import KV
from .model import (LOOPBACK, Backend, IPAddress, NodeView, ProxyModel, ProxyPort, ProxyService,
                    ServicePortView)

log = logging.getLogger("pycnid.proxy")
PREFIXES = (SERVICES, ENDPOINTS, POOLS, SERVICES_META, NODES)
EXTERNAL_TYPES = ("NodePort", "LoadBalancer")


@dataclass
class Records:
    """The store's records the proxy reads, by key."""

    services: dict[str, ServiceRecord] = field(default_factory=dict)
    endpoints: dict[str, EndpointRecord] = field(default_factory=dict)
    pools: dict[str, str] = field(default_factory=dict)  # cluster pool key -> CIDR
    settings: ServiceSettings | None = None
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    bad: set[str] = field(default_factory=set)

    def apply(self, kv: KV, deleted: bool = False) -> None:
        """One put or delete (an unreadable record is logged once and left out)."""
        try:
            self._apply(kv, deleted)
            self.bad.discard(kv.key)
        except (CorruptRecord, ValueError) as exc:
            self._forget(kv.key)
            if kv.key not in self.bad:
                log.warning("proxy: ignoring %s: %s", kv.key, exc)
                self.bad.add(kv.key)

    def _apply(self, kv: KV, deleted: bool) -> None:
        if deleted:
            return self._forget(kv.key)
        if kv.key.startswith(SERVICES):
            self.services[kv.key] = ServiceRecord.from_bytes(kv.key, kv.value)
        elif kv.key.startswith(ENDPOINTS):
            self.endpoints[kv.key] = EndpointRecord.from_bytes(kv.key, kv.value)
        elif kv.key.startswith(POOLS):
            self._apply_pool(kv)
        elif kv.key == SERVICES_META:
            self.settings = ServiceSettings.from_bytes(kv.key, kv.value)
        elif kv.key.startswith(NODES):
            self.nodes[kv.key[len(NODES):]] = NodeRecord.from_bytes(kv.key, kv.value)

    def _apply_pool(self, kv: KV) -> None:
        """A cluster pool's CIDR; a pool a netconf defined is not the cluster's."""
        record = decode(kv.key, kv.value)
        self.pools.pop(kv.key, None)
        if record.get("source") != "netconf" and record.get("cidr"):
            self.pools[kv.key] = str(ipaddress.ip_network(str(record["cidr"])))

    def _forget(self, key: str) -> None:
        for table in (self.services, self.endpoints, self.pools):
            table.pop(key, None)
        if key == SERVICES_META:
            self.settings = None
        if key.startswith(NODES):
            self.nodes.pop(key[len(NODES):], None)

    def replace_all(self, kvs: Iterable[KV], prefix: str) -> None:
        """A snapshot of one prefix replaces what was known under it."""
        for key in [k for table in (self.services, self.endpoints, self.pools)
                    for k in table if k.startswith(prefix)]:
            self._forget(key)
        if prefix == SERVICES_META:
            self.settings = None
        if prefix == NODES:
            self.nodes.clear()
        for kv in kvs:
            self.apply(kv)


def calc_node_ips(family: int, record_address: str, local: Iterable[str],
                  cluster_cidrs: Iterable[str]) -> tuple[IPAddress, ...]:
    """Where NodePorts answer: the node record's address and the node's other addresses of
    ``family``, never loopback, link-local nor a Pod pool's (a bridge gateway is no node IP)."""
    pools = [ipaddress.ip_network(c) for c in cluster_cidrs]
    found = set()
    for text in (record_address, *local):
        try:
            ip = ipaddress.ip_address(text.split("/")[0]) if text else None
        except ValueError:
            continue
        if ip is None or ip.version != family or ip in LOOPBACK[family] or ip.is_link_local:
            continue
        if not any(ip in p for p in pools if p.version == family):
            found.add(ip)
    return tuple(sorted(found))


def calc_node_view(records: Records, node: str, family: int,
                   local: Iterable[str] = ()) -> NodeView:
    record = records.nodes.get(node)
    pools = sorted(set(records.pools.values()))
    cidrs = records.settings.cidrs if records.settings else ()
    return NodeView(node, calc_node_ips(family, record.address if record else "", local, pools),
                    _nets(pools, family), _nets(cidrs, family))


def _nets(cidrs: Iterable[str], family: int) -> tuple:
    nets = {ipaddress.ip_network(c) for c in cidrs}
    return tuple(sorted(n for n in nets if n.version == family))


def calc_model(records: Records, node: str, family: int, local: Iterable[str] = ()) -> ProxyModel:
    """The table ``node`` programs for ``family`` (``local``: its own addresses, if known)."""
    views: list[ServicePortView] = []
    endpoints = sorted(records.endpoints.values(), key=lambda e: e.key)
    for key, record in sorted(records.services.items()):
        try:
            views += calc_port_views(record, endpoints, node, family)
        except (CNIError, ValueError) as exc:
            log.warning("proxy: Service %s left out: %s", key, exc)
    return ProxyModel(family, calc_node_view(records, node, family, local), tuple(views))


def calc_service(record: ServiceRecord, family: int) -> ProxyService:
    external = record.type in EXTERNAL_TYPES
    ports = tuple(ProxyPort(p.name, p.protocol.lower(), p.port,
                            p.node_port if external and p.node_port else None)
                  for p in record.ports)
    timeout = record.timeout_seconds if record.session_affinity == "ClientIP" else None
    return ProxyService(record.namespace, record.name, _ips(record.cluster_ips, family),
                        _ips(record.external_ips, family), ports, timeout,
                        record.external_traffic_policy == "Local",
                        record.internal_traffic_policy == "Local")


def _ips(texts: Iterable[str], family: int) -> tuple[IPAddress, ...]:
    """Addresses of ``family`` (an endpoint's may carry its prefix length)."""
    ips = (ipaddress.ip_address(text.split("/")[0]) for text in texts)
    return tuple(ip for ip in ips if ip.version == family)


def calc_port_views(record: ServiceRecord, endpoints: list[EndpointRecord], node: str,
                    family: int) -> list[ServicePortView]:
    """One view per port of a Service with a VIP of ``family`` (none: not in this table)."""
    service = calc_service(record, family)
    if not service.vips:
        return []
    picked = calc_endpoints(record, endpoints)
    views = []
    for port, spec in zip(service.ports, record.ports):
        label = spec.name or str(spec.port)
        backends = {Backend(ip, ports[label], e.node, e.node == node)
                    for e, ports in picked if label in ports for ip in _ips(e.ips, family)}
        views.append(ServicePortView(service, port, tuple(sorted(
            backends, key=lambda b: (int(b.ip), b.port, b.node)))))
    return views

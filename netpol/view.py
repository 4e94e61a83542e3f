"""The store records the NetworkPolicy sync reads, kept as ``PolicyInputs`` (``evaluate.py``).

``Records`` is the view ``store/watched.py`` keeps current from ``PREFIXES``:

- ``/pycni/v1/netpols/<ns>/<name>``: ``NetworkPolicy.to_dict()`` (parsed by ``parse_policy``,
  so a record written by hand is validated as the API server would);
- ``/pycni/v1/namespaces/<ns>``: ``{"labels": {...}}`` (no record: the name label only);
- ``/pycni/v1/endpoints/<ns>/<pod>/<ifname>``: the Pods (``services.record.EndpointRecord``:
  addresses, labels, node, named ports). A named port's protocol is TCP unless the record's
  extra fields carry ``"portProtocols": {name: protocol}``. A Pod without an endpoint record
  (no pycni-svc in its conflist) is neither isolated nor a peer;
- ``/pycni/v1/nodes/<node>``: each node record's address, the nodes' addresses of the model.

An unreadable record is logged once and left out; the others still apply.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from cni.spec.errors import CNIError
from netpol.evaluate import NamedPort, PodInfo, PolicyInputs, pod_infos
from netpol.policy import NetworkPolicy, parse_policy
from nodes.record import NodeRecord
from services.record import EndpointRecord
from store.base import KV
from store.codec import CorruptRecord, decode
from store.keys import ENDPOINTS, NAMESPACES, NETPOLS, NODES

log = logging.getLogger("pycnid.netpol")
PREFIXES = (NETPOLS, NAMESPACES, ENDPOINTS, NODES)
PROTOCOLS = ("TCP", "UDP", "SCTP")


class Records:
    def __init__(self) -> None:
        self.policies: dict[str, NetworkPolicy] = {}
        self.namespaces: dict[str, Mapping[str, str]] = {}
        self.endpoints: dict[str, EndpointRecord] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.bad: set[str] = set()
        self.version = 0  # bumped by every change: the sync renders when it moved

    def replace_all(self, kvs: Iterable[KV], prefix: str) -> None:
        present: set[str] = set()
        for kv in kvs:
            present.add(kv.key)
            self.apply(kv)
        for table in self._tables():
            for key in [k for k in table if k.startswith(prefix) and k not in present]:
                del table[key]
                self.version += 1

    def apply(self, kv: KV, deleted: bool = False) -> bool:
        before = self.version
        try:
            self._apply(kv, deleted)
            self.bad.discard(kv.key)
        except (CNIError, ValueError) as exc:
            self._forget(kv.key)
            if kv.key not in self.bad:
                log.warning("netpol: ignoring %s: %s", kv.key, getattr(exc, "msg", exc))
                self.bad.add(kv.key)
        return self.version != before

    def _apply(self, kv: KV, deleted: bool) -> None:
        if deleted:
            return self._forget(kv.key)
        table, value = self._parse(kv)
        if table.get(kv.key) != value:
            table[kv.key] = value
            self.version += 1
        return None

    def _parse(self, kv: KV) -> tuple[dict, object]:
        if kv.key.startswith(NETPOLS):
            return self.policies, parse_policy(decode(kv.key, kv.value))
        if kv.key.startswith(NAMESPACES):
            return self.namespaces, read_namespace_labels(kv)
        if kv.key.startswith(ENDPOINTS):
            return self.endpoints, EndpointRecord.from_bytes(kv.key, kv.value)
        if kv.key.startswith(NODES):
            return self.nodes, NodeRecord.from_bytes(kv.key, kv.value)
        raise CorruptRecord(f"unexpected key {kv.key}", "not a NetworkPolicy input")

    def _forget(self, key: str) -> None:
        for table in self._tables():
            if table.pop(key, None) is not None:
                self.version += 1

    def _tables(self) -> tuple[dict, ...]:
        return (self.policies, self.namespaces, self.endpoints, self.nodes)

    def inputs(self) -> PolicyInputs:
        namespaces = {k[len(NAMESPACES) :]: v for k, v in self.namespaces.items()}
        node_ips = {r.name: (r.address,) for r in self.nodes.values() if r.address}
        return PolicyInputs(
            calc_pods(self.endpoints.values()),
            namespaces,
            tuple(sorted(self.policies.values(), key=lambda p: p.ref)),
            node_ips,
        )


def read_namespace_labels(kv: KV) -> Mapping[str, str]:
    labels = decode(kv.key, kv.value).get("labels") or {}
    if not isinstance(labels, dict):
        raise CorruptRecord(f"corrupt namespace record {kv.key}", "labels is not an object")
    return {str(k): str(v) for k, v in sorted(labels.items())}


def calc_pods(endpoints: Iterable[EndpointRecord]) -> tuple[PodInfo, ...]:
    """One ``PodInfo`` per Pod: its attachments' addresses and named ports together."""
    pods: dict[tuple[str, str], PodInfo] = {}
    for record in sorted(endpoints, key=lambda r: r.key):
        known = pods.get((record.namespace, record.pod))
        ports = calc_named_ports(record)
        if known is None:
            pods[(record.namespace, record.pod)] = PodInfo(
                record.namespace, record.pod, record.ips, dict(record.labels), record.node, ports
            )
        else:
            pods[(record.namespace, record.pod)] = PodInfo(
                known.namespace,
                known.name,
                known.ips + record.ips,
                known.labels,
                known.node,
                known.ports + ports,
            )
    return pod_infos(pods.values())


def calc_named_ports(record: EndpointRecord) -> tuple[NamedPort, ...]:
    """The record's named ports with their protocol: ``portProtocols`` when the record has
    it (a port whose protocol there is none of TCP, UDP, SCTP matches nothing: left out,
    logged), else TCP."""
    protocols = record.extra.get("portProtocols")
    protocols = protocols if isinstance(protocols, dict) else {}
    found = []
    for name, port in sorted(record.ports.items()):
        protocol = str(protocols.get(name) or "TCP").upper()
        if protocol not in PROTOCOLS:
            log.warning("netpol: %s: port %s has protocol %s", record.key, name, protocol)
            continue
        found.append(NamedPort(name, protocol, port))
    return tuple(found)

"""NetworkPolicies, namespaces and the Pods policies select, as the store holds them.

A policy at ``/pycni/v1/netpols/<ns>/<name>`` is the manifest ``NetworkPolicy.to_dict``
renders (the API's defaults applied) and reads back through ``parse_policy``, so a stored
policy is always one the API server would take. A namespace's labels are at
``/pycni/v1/namespaces/<ns>`` as ``{"labels": {...}}`` (fields it does not know are kept);
without a record a namespace has only ``kubernetes.io/metadata.name``, which
``PolicyInputs.namespace_labels`` adds to every namespace. The Pods are the endpoint records
pycni-svc writes for each attachment from ``K8S_POD_NAMESPACE``/``K8S_POD_NAME`` (one Pod per
namespace/name, its attachments' addresses together), so every Pod pycni attaches with those
is selectable. The nodes' addresses (the exemption for a Pod's own node) are their node
records': ``address``, the overlay's underlay and VTEPs.

A record that does not read is skipped and named (``unreadable``), never fatal: one bad record
must not hide every other policy.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cni.spec.errors import CNIError
from netpol.evaluate import NAME_LABEL, NamedPort, PodInfo, PolicyInputs, pod_infos
from netpol.policy import NetworkPolicy, parse_policy
from nodes.record import NodeRecord
from services.proxy.inputs import ProxyInputs
from services.record import EndpointRecord
from services.validate import LABEL_KEY, LABEL_VALUE
from store.base import KV, Store
from store.codec import CorruptRecord, decode, encode
from store.keys import ENDPOINTS, NAMESPACES, NETPOLS, NODES, PROXY_INPUTS, netpol_key


def encode_policy(policy: NetworkPolicy) -> bytes:
    return encode(policy.to_dict())


def decode_policy(kv: KV) -> NetworkPolicy:
    """The policy stored at ``kv.key``; ``CorruptRecord`` naming the key when it is not JSON,
    not a valid NetworkPolicy, or names another namespace/name than its key."""
    data = decode(kv.key, kv.value)
    try:
        policy = parse_policy(data, "")
    except (CNIError, ValueError, TypeError) as exc:
        raise CorruptRecord(f"corrupt NetworkPolicy record {kv.key}", str(exc)) from None
    if netpol_key(policy.namespace, policy.name) != kv.key:
        raise CorruptRecord(
            f"corrupt NetworkPolicy record {kv.key}", f"it holds {policy.ref}, not its key's"
        )
    return policy


@dataclass(frozen=True)
class NamespaceRecord:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    FIELDS = ("labels",)

    def to_bytes(self) -> bytes:
        return encode({**self.extra, "labels": dict(sorted(self.labels.items()))})

    @classmethod
    def from_kv(cls, kv: KV) -> NamespaceRecord:
        data = decode(kv.key, kv.value)
        labels = data.get("labels") or {}
        why = (
            "labels is not an object"
            if not isinstance(labels, dict)
            else next(filter(None, (label_problem(k, v) for k, v in labels.items())), None)
        )
        if why:
            raise CorruptRecord(f"corrupt namespace record {kv.key}", why)
        extra = {k: v for k, v in data.items() if k not in cls.FIELDS}
        own = {k: v for k, v in labels.items() if k != NAME_LABEL}  # every namespace's name
        return cls(kv.key[len(NAMESPACES) :], own, extra)


def label_problem(key: Any, value: Any) -> str | None:
    """Why ``key: value`` is no label the API server takes (None: it is one)."""
    if not isinstance(key, str) or not LABEL_KEY.fullmatch(key):
        return f"{key!r} is not a label key"
    if not isinstance(value, str) or not LABEL_VALUE.fullmatch(value):
        return f"{value!r} is not a label value (at most 63 of A-Z, a-z, 0-9, '-', '_', '.')"
    return None


@dataclass(frozen=True)
class StoredModel:
    """What the store holds for NetworkPolicy: the model ``netpol.evaluate`` judges, and the
    keys of the records that did not read."""

    inputs: PolicyInputs
    unreadable: tuple[str, ...] = ()


def read_policies(store: Store, namespace: str | None = None) -> tuple[list, list[str]]:
    """(policies by namespace/name, unreadable keys)."""
    prefix = f"{NETPOLS}{namespace}/" if namespace else NETPOLS
    return read_all(store.range(prefix), decode_policy)


def read_namespaces(store: Store) -> tuple[list, list[str]]:
    return read_all(store.range(NAMESPACES), NamespaceRecord.from_kv)


def read_endpoints(store: Store) -> tuple[list, list[str]]:
    return read_all(store.range(ENDPOINTS), lambda kv: EndpointRecord.from_bytes(kv.key, kv.value))


def read_all(kvs: Iterable[KV], read: Any) -> tuple[list, list[str]]:
    found, unreadable = [], []
    for kv in kvs:
        try:
            found.append(read(kv))
        except CorruptRecord:
            unreadable.append(kv.key)
    return found, unreadable


def calc_pods(endpoints: Iterable[EndpointRecord]) -> tuple[PodInfo, ...]:
    """One ``PodInfo`` per namespace/pod: its attachments' addresses and named ports together
    (labels and node are the Pod's, the same on each attachment)."""
    grouped: dict[tuple[str, str], list[EndpointRecord]] = {}
    for record in endpoints:
        grouped.setdefault((record.namespace, record.pod), []).append(record)
    return pod_infos(calc_pod(records) for records in grouped.values())


def calc_pod(records: list[EndpointRecord]) -> PodInfo:
    """The Pod of its endpoint records (one per attachment, in key order). What repeats across
    Pods is shared, not copied: the labels (the record's are read-only and shared), the named
    ports (one tuple per distinct set), a lone record's addresses."""
    first = records[0]
    ports = {(n, r.protocol_of(n), port) for r in records for n, port in r.ports.items()}
    ips = tuple(dict.fromkeys(ip for r in records for ip in r.ips))
    return PodInfo(
        first.namespace,
        first.pod,
        first.ips if ips == first.ips else ips,
        first.labels,
        first.node,
        shared_named_ports(tuple(sorted(ports))),
    )


@functools.lru_cache(maxsize=4096)
def shared_named_ports(ports: tuple[tuple[str, str, int], ...]) -> tuple[NamedPort, ...]:
    """One tuple of ``NamedPort`` for all the Pods that name the same ports (a Deployment's):
    three per Pod held ~4 MiB at 10,000 Pods."""
    return tuple(NamedPort(*port) for port in ports)


def calc_node_ips(
    nodes: Iterable[NodeRecord], published: Mapping[str, Iterable[str]] | None = None
) -> dict[str, tuple[str, ...]]:
    """Each node's addresses: its record's, the overlay's, and those its Service proxy
    published (``ProxyInputs``: every local address, the bridge's gateway included, which is
    the source of kubelet's probes to a Pod on that node)."""
    out = {}
    for node in nodes:
        ips = [node.address]
        if node.overlay is not None:
            ips += [node.overlay.underlay, *node.overlay.vteps]
        ips += [ip.split("/")[0] for ip in (published or {}).get(node.name, ())]
        out[node.name] = tuple(dict.fromkeys(ip for ip in ips if ip))
    return out


def read_published(store: Store) -> dict[str, tuple[str, ...]]:
    """The addresses each node's proxy published (an unreadable record: none)."""
    found = {}
    for kv in store.range(PROXY_INPUTS):
        try:
            found[kv.key[len(PROXY_INPUTS) :]] = ProxyInputs.from_bytes(kv.key, kv.value).addresses
        except (CorruptRecord, ValueError):
            continue
    return found


def read_model(store: Store) -> StoredModel:
    """The policies, namespaces' labels, Pods and nodes' addresses as the store holds them
    now (one read per prefix)."""
    policies, bad_policies = read_policies(store)
    namespaces, bad_namespaces = read_namespaces(store)
    endpoints, bad_endpoints = read_endpoints(store)
    nodes, bad_nodes = read_all(
        store.range(NODES), lambda kv: NodeRecord.from_bytes(kv.key, kv.value)
    )
    inputs = PolicyInputs(
        calc_pods(endpoints),
        {n.name: dict(n.labels) for n in namespaces},
        tuple(policies),
        calc_node_ips(nodes, read_published(store)),
    )
    return StoredModel(inputs, (*bad_policies, *bad_namespaces, *bad_endpoints, *bad_nodes))

"""The Service, endpoint and settings records as stored (pure, no I/O).

A Service at ``/pycni/v1/services/<ns>/<name>``::

    {"namespace": "default", "name": "web", "type": "NodePort",
     "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http",
                "nodePort": 30080}],
     "clusterIPs": ["10.96.0.1"], "externalIPs": [], "selector": {"app": "web"},
     "sessionAffinity": "None", "timeoutSeconds": 10800,
     "externalTrafficPolicy": "Cluster", "internalTrafficPolicy": "Cluster"}

A LoadBalancer Service also carries ``loadBalancerIPs``, its load balancer's ingress addresses
(set by whatever provides them; the proxy DNATs them like externalIPs), and may carry
``loadBalancerSourceRanges``; both are left out of the record when empty.

Each of its clusterIPs and nodePorts has an index key (``serviceips/<ip>``,
``nodeports/<proto>/<port>``) whose value is "ns/name", written in the same txn as the Service,
so no VIP or nodePort is held twice. An endpoint (what pycni-svc publishes for a Pod's
attachment) is at ``/pycni/v1/endpoints/<ns>/<pod>/<ifname>``. Records keep the fields they
do not know, as every record of ``ipam.records`` does.
"""

from __future__ import annotations

import ipaddress
import sys
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn, TypeVar

from store.codec import CorruptRecord, decode, encode
from store.keys import ENDPOINTS, NODE_PORTS, SERVICE_IPS, SERVICES

DEFAULT_NODE_PORT_RANGE = (30000, 32767)
DEFAULT_AFFINITY_TIMEOUT = 10800  # seconds a ClientIP affinity lasts (Kubernetes' default)
HEALTH_CHECK_TYPES = ("NodePort", "LoadBalancer")  # with externalTrafficPolicy Local


def wants_health_check(kind: object, external_policy: object) -> bool:
    """A Service of this type and externalTrafficPolicy has a healthCheckNodePort: load
    balancers ask each node whether it has local endpoints."""
    return kind in HEALTH_CHECK_TYPES and external_policy == "Local"


def service_key(namespace: str, name: str) -> str:
    return f"{SERVICES}{namespace}/{name}"


def service_ip_key(ip: str) -> str:
    return f"{SERVICE_IPS}{ip}"


def node_port_key(protocol: str, port: int) -> str:
    return f"{NODE_PORTS}{protocol}/{port}"


def endpoints_prefix(namespace: str) -> str:
    return f"{ENDPOINTS}{namespace}/"


def endpoint_key(namespace: str, pod: str, ifname: str) -> str:
    return f"{endpoints_prefix(namespace)}{pod}/{ifname}"


#: Fields whose values are one per record: never interned (the rest repeat across records).
UNIQUE_FIELDS = frozenset({"name", "pod", "containerID"})


def unknown(data: Mapping[str, Any], known: tuple[str, ...]) -> Mapping[str, Any]:
    return {k: v for k, v in data.items() if k not in known} or EMPTY


class Labels(dict):
    """Labels or a selector shared by every record that has the same ones (``shared_labels``):
    read-only, and weakly referenceable so the sharing lasts while a record holds them."""

    __slots__ = ("__weakref__",)

    def _read_only(self, *_: object, **__: object) -> NoReturn:
        raise TypeError("a record's labels are read-only")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _read_only
    __ior__ = _read_only

    def __reduce__(self) -> tuple[type, tuple[tuple[tuple[Any, Any], ...]]]:
        return Labels, (tuple(self.items()),)

    def __copy__(self) -> Labels:
        return self

    def __deepcopy__(self, memo: dict) -> Labels:
        return self


#: The one empty mapping every record without unknown fields, named ports or labels shares
#: (a pycnid holding 10k Services x 5 endpoints had 110k empty dicts).
EMPTY: Mapping[str, Any] = Labels()


_LABELS: weakref.WeakValueDictionary[tuple[tuple[str, str], ...], Labels] = (
    weakref.WeakValueDictionary()
)


def shared_labels(raw: Mapping[Any, Any] | None) -> Mapping[str, str]:
    """``raw`` as str -> str, one object for all the records with the same labels: the
    endpoints of one Deployment and the Service selecting them hold one dict, not one each
    (184 bytes: 50k endpoints held 9 MiB of them)."""
    if not raw:
        return EMPTY
    items = tuple(sorted((sys.intern(str(k)), sys.intern(str(v))) for k, v in raw.items()))
    found = _LABELS.get(items)
    if found is None:
        found = Labels(items)
        _LABELS[items] = found
    return found


V = TypeVar("V")  # a shared mapping's values: port numbers, protocols


class Ports(Labels):
    """Named ports shared by every record that has the same ones (``shared_ports``), read-only
    as ``Labels`` are."""

    __slots__ = ()

    def __reduce__(self) -> tuple[type, tuple[tuple[tuple[Any, Any], ...]]]:
        return Ports, (tuple(self.items()),)


_PORTS: weakref.WeakValueDictionary[tuple[tuple[str, Any], ...], Ports] = (
    weakref.WeakValueDictionary()
)


def shared_ports(ports: Mapping[str, V]) -> Mapping[str, V]:
    """``ports`` (in its order), one object for all the records with the same ones: the
    endpoints of every EndpointSlice of a Deployment's Services name the same ports (184 bytes
    a dict: 10k slices held 1.8 MiB of them), and the Pods of one Deployment the same named
    ports and their protocols (an endpoint record's ``ports`` and ``port_protocols``)."""
    if not ports:
        return EMPTY
    items = tuple(ports.items())
    found = _PORTS.get(items)
    if found is None:
        found = Ports(items)
        _PORTS[items] = found
    return found


def intern_strings(data: dict) -> dict:
    """A decoded record with its repeated strings interned, in place: the proxy holds every
    Service and endpoint record, whose namespaces, node names, label pairs, types, protocols
    and policies repeat; interned, each is held once, not once a record. One walk over the
    fields and the objects in them (a ``json`` object hook cost 3x as much)."""
    for k, v in data.items():
        if v.__class__ is str:
            if k not in UNIQUE_FIELDS:
                data[k] = sys.intern(v)
        elif v.__class__ is dict:
            data[k] = _interned(v)
        elif v.__class__ is list and v and v[0].__class__ is dict:
            data[k] = [_interned(item) if item.__class__ is dict else item for item in v]
    return data


def _interned(obj: dict) -> dict:
    return {
        sys.intern(k): sys.intern(v) if v.__class__ is str and k not in UNIQUE_FIELDS else v
        for k, v in obj.items()
    }


@dataclass(frozen=True, slots=True)
class ServicePort:
    name: str
    protocol: str
    port: int
    target_port: int | str
    node_port: int = 0  # 0: none (ClusterIP), or not allocated yet
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    FIELDS = ("name", "protocol", "port", "targetPort", "nodePort")

    def to_dict(self) -> dict:
        data = {
            **self.extra,
            "name": self.name,
            "protocol": self.protocol,
            "port": self.port,
            "targetPort": self.target_port,
        }
        return {**data, "nodePort": self.node_port} if self.node_port else data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServicePort:
        target = data.get("targetPort", data["port"])
        return cls(
            str(data.get("name") or ""),
            str(data.get("protocol") or "TCP"),
            int(data["port"]),
            target if isinstance(target, str) else int(target),
            int(data.get("nodePort") or 0),
            unknown(data, cls.FIELDS),
        )


@dataclass(frozen=True, slots=True)
class ServiceRecord:
    namespace: str
    name: str
    type: str = "ClusterIP"
    ports: tuple[ServicePort, ...] = ()
    cluster_ips: tuple[str, ...] = ()
    external_ips: tuple[str, ...] = ()
    selector: Mapping[str, str] = field(default_factory=dict)
    session_affinity: str = "None"
    timeout_seconds: int = DEFAULT_AFFINITY_TIMEOUT
    external_traffic_policy: str = "Cluster"
    internal_traffic_policy: str = "Cluster"
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    health_check_node_port: int = 0  # 0: none (``wants_health_check``), or not allocated yet
    load_balancer_ips: tuple[str, ...] = ()
    load_balancer_source_ranges: tuple[str, ...] = ()

    FIELDS = (
        "namespace",
        "name",
        "type",
        "ports",
        "clusterIPs",
        "externalIPs",
        "selector",
        "sessionAffinity",
        "timeoutSeconds",
        "externalTrafficPolicy",
        "internalTrafficPolicy",
        "healthCheckNodePort",
        "loadBalancerIPs",
        "loadBalancerSourceRanges",
    )

    @property
    def ref(self) -> str:
        """What its index keys hold: "ns/name"."""
        return f"{self.namespace}/{self.name}"

    @property
    def key(self) -> str:
        return service_key(self.namespace, self.name)

    def index_keys(self) -> set[str]:
        """The uniqueness index keys this Service holds (its VIPs and nodePorts, its
        healthCheckNodePort a TCP one)."""
        keys = {
            *(service_ip_key(ip) for ip in self.cluster_ips),
            *(node_port_key(p.protocol, p.node_port) for p in self.ports if p.node_port),
        }
        if self.health_check_node_port:
            keys.add(node_port_key("TCP", self.health_check_node_port))
        return keys

    @property
    def wants_health_check(self) -> bool:
        return wants_health_check(self.type, self.external_traffic_policy)

    def to_dict(self) -> dict:
        lb = {
            "loadBalancerIPs": list(self.load_balancer_ips),
            "loadBalancerSourceRanges": list(self.load_balancer_source_ranges),
        }
        return {
            **self.extra,
            "namespace": self.namespace,
            "name": self.name,
            "type": self.type,
            "ports": [p.to_dict() for p in self.ports],
            "clusterIPs": list(self.cluster_ips),
            "externalIPs": list(self.external_ips),
            "selector": dict(self.selector),
            "sessionAffinity": self.session_affinity,
            "timeoutSeconds": self.timeout_seconds,
            "externalTrafficPolicy": self.external_traffic_policy,
            "internalTrafficPolicy": self.internal_traffic_policy,
            **({"healthCheckNodePort": hc} if (hc := self.health_check_node_port) else {}),
            **{k: v for k, v in lb.items() if v},
        }

    def to_bytes(self) -> bytes:
        return encode(self.to_dict())

    def spec(self) -> dict:
        """The input spec that describes this record (``services.validate``): its fields
        only, no timeout without affinity."""
        spec = {k: v for k, v in self.to_dict().items() if k in self.FIELDS}
        spec["ports"] = [
            {k: v for k, v in p.to_dict().items() if k in ServicePort.FIELDS} for p in self.ports
        ]
        if self.session_affinity != "ClientIP":
            del spec["timeoutSeconds"]
        return spec

    def with_extras_of(self, old: ServiceRecord) -> ServiceRecord:
        """This record keeping the unknown fields ``old`` carried (its own, its ports')."""
        extras = {(p.name, p.protocol, p.port): p.extra for p in old.ports}
        return replace(
            self,
            extra=old.extra,
            ports=tuple(
                replace(p, extra=extras.get((p.name, p.protocol, p.port), p.extra))
                for p in self.ports
            ),
        )

    @classmethod
    def from_bytes(cls, key: str, value: bytes) -> ServiceRecord:
        return cls.from_dict(key, intern_strings(decode(key, value)))

    @classmethod
    def from_dict(cls, key: str, data: Mapping[str, Any]) -> ServiceRecord:
        try:
            return cls(
                str(data["namespace"]),
                str(data["name"]),
                str(data.get("type") or "ClusterIP"),
                tuple(ServicePort.from_dict(p) for p in data["ports"]),
                tuple(map(str, data.get("clusterIPs") or ())),
                tuple(map(str, data.get("externalIPs") or ())),
                shared_labels(data.get("selector")),
                str(data.get("sessionAffinity") or "None"),
                int(data.get("timeoutSeconds") or DEFAULT_AFFINITY_TIMEOUT),
                str(data.get("externalTrafficPolicy") or "Cluster"),
                str(data.get("internalTrafficPolicy") or "Cluster"),
                unknown(data, cls.FIELDS),
                int(data.get("healthCheckNodePort") or 0),
                load_balancer_ips=tuple(map(str, data.get("loadBalancerIPs") or ())),
                load_balancer_source_ranges=tuple(
                    map(str, data.get("loadBalancerSourceRanges") or ())
                ),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptRecord(f"corrupt Service record {key}", f"bad service: {exc!r}") from None


def read_condition(data: Mapping[str, Any], name: str, default: bool) -> bool:
    """An endpoint condition: absent (a record from before conditions, or JSON null) reads
    as Kubernetes reads an unset one — ready, serving as ready, not terminating."""
    value = data.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{name} {value!r} is not true or false")
    return value


def read_port_protocols(data: Mapping[str, Any]) -> Mapping[str, str]:
    """``portProtocols`` as stored: {name: "UDP" | "SCTP"} (TCP ones are left out)."""
    raw = data.get("portProtocols") or {}
    if not isinstance(raw, dict):
        raise TypeError(f"portProtocols {raw!r} is not an object")
    return {str(k): str(v) for k, v in raw.items() if v != "TCP"} or EMPTY


@dataclass(frozen=True, slots=True)
class EndpointRecord:
    """One Pod attachment that may serve Services: its IPs, labels and named ports."""

    namespace: str
    pod: str
    ifname: str
    ips: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    node: str = ""
    ports: Mapping[str, int] = field(default_factory=dict)  # named container ports
    container_id: str = ""
    network: str = ""  # with container_id and ifname: the attachment DEL and GC look for
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    ready: bool = True  # the conditions of a Kubernetes EndpointSlice endpoint (after
    serving: bool = True  # ``extra``: every positional construction stays as it was)
    terminating: bool = False
    # The protocol of each named port that is not TCP (``args.cni.ports``' "protocol"): a
    # name absent is TCP, so records from before this field and TCP-only records read the
    # same and keep their bytes. NetworkPolicy resolves a named port by name and protocol.
    port_protocols: Mapping[str, str] = field(default_factory=dict)

    FIELDS = (
        "namespace",
        "pod",
        "ifname",
        "ips",
        "labels",
        "node",
        "ports",
        "containerID",
        "network",
        "ready",
        "serving",
        "terminating",
        "portProtocols",
    )
    CONDITIONS = ("ready", "serving", "terminating")

    @property
    def key(self) -> str:
        return endpoint_key(self.namespace, self.pod, self.ifname)

    def to_dict(self) -> dict:
        return {
            **self.extra,
            "namespace": self.namespace,
            "pod": self.pod,
            "ifname": self.ifname,
            "ips": list(self.ips),
            "labels": dict(self.labels),
            "node": self.node,
            "ports": dict(self.ports),
            "containerID": self.container_id,
            "network": self.network,
            "ready": self.ready,
            "serving": self.serving,
            "terminating": self.terminating,
            **({"portProtocols": dict(p)} if (p := self.port_protocols) else {}),
        }

    def to_bytes(self) -> bytes:
        return encode(self.to_dict())

    def protocol_of(self, port_name: str) -> str:
        return self.port_protocols.get(port_name, "TCP")

    @property
    def usable(self) -> bool:
        """May take traffic: ready, or serving while terminating (the fallback when a
        Service has no ready endpoint, ``services.proxy.model.select_backends``)."""
        return self.ready or (self.serving and self.terminating)

    @classmethod
    def from_bytes(cls, key: str, value: bytes) -> EndpointRecord:
        data = intern_strings(decode(key, value))
        try:
            ready = read_condition(data, "ready", True)
            return cls(
                str(data["namespace"]),
                str(data["pod"]),
                str(data["ifname"]),
                tuple(map(str, data.get("ips") or ())),
                shared_labels(data.get("labels")),
                str(data.get("node") or ""),
                shared_ports({str(k): int(v) for k, v in (data.get("ports") or {}).items()}),
                str(data.get("containerID") or ""),
                str(data.get("network") or ""),
                unknown(data, cls.FIELDS),
                ready=ready,
                serving=read_condition(data, "serving", ready),
                terminating=read_condition(data, "terminating", False),
                port_protocols=shared_ports(read_port_protocols(data)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptRecord(
                f"corrupt endpoint record {key}", f"bad endpoint: {exc!r}"
            ) from None


@dataclass(frozen=True)
class ServiceSettings:
    """The cluster's service CIDRs (at most one per family) and nodePort range."""

    cidrs: tuple[str, ...] = ()
    node_port_range: tuple[int, int] = DEFAULT_NODE_PORT_RANGE
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    FIELDS = ("cidrs", "nodePortRange")

    @property
    def range_text(self) -> str:
        return f"{self.node_port_range[0]}-{self.node_port_range[1]}"

    def to_dict(self) -> dict:
        return {**self.extra, "cidrs": list(self.cidrs), "nodePortRange": self.range_text}

    def to_bytes(self) -> bytes:
        return encode(self.to_dict())

    @classmethod
    def from_bytes(cls, key: str, value: bytes) -> ServiceSettings:
        data = decode(key, value)
        try:
            low, _, high = str(data.get("nodePortRange") or "").partition("-")
            cidrs = tuple(map(str, data.get("cidrs") or ()))
            for cidr in cidrs:  # strict: a host-bit CIDR is not a service CIDR
                ipaddress.ip_network(cidr)
            return cls(cidrs, (int(low), int(high)), unknown(data, cls.FIELDS))
        except (TypeError, ValueError, AttributeError) as exc:
            raise CorruptRecord(
                f"corrupt service settings {key}", f"bad settings: {exc!r}"
            ) from None

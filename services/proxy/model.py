"""What the Service proxy programs, independent of storage: frozen, family-scoped views.

The store side (records, the registry watch) turns Services and endpoints into these; the
renderer (render.py) and the tracer (trace.py) read the very same objects, so the tracer's
answer is the ruleset's behaviour by construction rather than a second interpretation.
``Backend.local`` is relative to the node being rendered: the view is per node.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import NamedTuple

from cni.spec.errors import InvalidConfig

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
PROTOCOLS = ("tcp", "udp", "sctp")
LOOPBACK = {4: ipaddress.ip_network("127.0.0.0/8"), 6: ipaddress.ip_network("::1/128")}


class TextIPv4Address(ipaddress.IPv4Address):
    """An address with its text as nft writes it, made once when it is parsed: a full render
    writes each endpoint address into ~1.7 elements (85k at 10k Services)."""

    __slots__ = ("text",)
    text: str


class TextIPv6Address(ipaddress.IPv6Address):
    """``TextIPv4Address`` for IPv6."""

    __slots__ = ("text",)
    text: str


@dataclass(frozen=True)
class ProxyPort:
    """One port of a Service; ``node_port`` None when it is not a NodePort."""

    name: str
    protocol: str
    port: int
    node_port: int | None = None

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise InvalidConfig("invalid key 'protocol'")
        for key, value in (("port", self.port), ("nodePort", self.node_port)):
            if value is not None and not 0 < value < 65536:
                raise InvalidConfig(f"invalid key '{key}'")


@dataclass(frozen=True)
class ProxyService:
    """A Service as the proxy sees it: VIPs of one family at render time, policies; a
    LoadBalancer's ingress IPs are external entries like externalIPs, and its source ranges
    (of the family) limit who reaches them."""

    namespace: str
    name: str
    vips: tuple[IPAddress, ...]
    external_ips: tuple[IPAddress, ...] = ()
    ports: tuple[ProxyPort, ...] = ()
    affinity_timeout: int | None = None
    external_local: bool = False
    internal_local: bool = False
    load_balancer_ips: tuple[IPAddress, ...] = ()
    source_ranges: tuple[IPNetwork, ...] = ()

    def __post_init__(self) -> None:
        if self.affinity_timeout is not None and not 0 < self.affinity_timeout <= 86400:
            raise InvalidConfig("invalid key 'affinityTimeout'")


class Backend(NamedTuple):
    """An endpoint address serving one port; ``local`` = on the node being rendered;
    ``ready`` False: serving while terminating, used only when no ready one is left
    (``select_backends``). A tuple: a full render at 10k Services makes 50k of them."""

    ip: IPAddress
    port: int
    node: str
    local: bool
    ready: bool = True


#: Builds a NamedTuple (a ``Backend``, an ``Element``) from a tuple of its fields without the
#: NamedTuple's Python-level ``__new__``: a third of each one's making, where a full render
#: makes ~60k backends and ~85k elements.
new_tuple = tuple.__new__


def select_backends(backends: tuple[Backend, ...]) -> tuple[Backend, ...]:
    """Kubernetes' choice among usable endpoints (ready, or serving and terminating): the
    ready ones; if there are none, the serving terminating ones; none left is a reject (or
    a drop, under a Local policy while others serve elsewhere). The proxy's elements and
    the tracer both get their backends from here, through ``calc_backends``. All ready (the
    common case) returns ``backends`` itself: a full render calls this per entry point."""
    for b in backends:
        if not b.ready:
            break
    else:
        return backends
    return tuple([b for b in backends if b.ready]) or backends


@dataclass(frozen=True)
class ServicePortView:
    """One service port with the backends that may serve it: its usable endpoints, ready or
    serving while terminating (which ones take new connections: ``calc_backends``)."""

    service: ProxyService
    port: ProxyPort
    backends: tuple[Backend, ...] = ()

    def __post_init__(self) -> None:
        """Each backend once, in the order given: an element's index is its place in it (the
        store's view gives address order; the table keeps an affinity port's order)."""
        unique = {(int(b.ip), b.port): b for b in self.backends}
        if len(unique) != len(self.backends):
            object.__setattr__(self, "backends", tuple(unique.values()))

    @classmethod
    def of_unique(
        cls, service: ProxyService, port: ProxyPort, backends: tuple[Backend, ...]
    ) -> ServicePortView:
        """A view whose ``backends`` are each once already (``view.calc_port_views`` makes
        them so): built without ``__post_init__``'s pass over them, which was ~10% of a full
        render's views (~13k of them at 10k Services)."""
        view = object.__new__(cls)
        for name, value in (("service", service), ("port", port), ("backends", backends)):
            object.__setattr__(view, name, value)
        return view

    def calc_backends(self, external: bool, in_cluster: bool = False) -> tuple[Backend, ...]:
        """The backends an entry may choose: only local ones under a Local policy. A client in
        the cluster (a Pod, or the node itself) reaching an external entry is short-circuited:
        externalTrafficPolicy applies to external traffic only, so it reaches every backend,
        as through a ClusterIP (``in_cluster`` is ignored on a ClusterIP entry, where
        internalTrafficPolicy is about exactly those clients). Each bucket is chosen by
        readiness on its own (``select_backends``)."""
        if not self.is_local_policy(external) or external and in_cluster:
            return select_backends(self.backends)
        return select_backends(tuple(b for b in self.backends if b.local))

    def is_short_circuit(self, external: bool) -> bool:
        """Whether an entry has a second dispatch for clients in the cluster: an external
        entry under externalTrafficPolicy Local, with endpoints somewhere."""
        return external and self.service.external_local and bool(self.backends)

    def is_local_policy(self, external: bool) -> bool:
        return self.service.external_local if external else self.service.internal_local


@dataclass(frozen=True)
class NodeView:
    """The node's side: NodePort addresses (never loopback), Pod pools, service CIDRs, and how
    its proxy tells local traffic (``local_bridge``: by the bridge a packet comes in on, else
    by the cluster CIDRs) and whether it masquerades all ClusterIP traffic."""

    node: str
    node_ips: tuple[IPAddress, ...] = ()
    cluster_cidrs: tuple[IPNetwork, ...] = ()
    service_cidrs: tuple[IPNetwork, ...] = ()
    masquerade_all: bool = False
    local_bridge: str | None = None

    def __post_init__(self) -> None:
        if any(ip in LOOPBACK[ip.version] for ip in self.node_ips):
            raise InvalidConfig("invalid key 'nodeIPs' (loopback cannot serve NodePorts)")


@dataclass(frozen=True)
class ProxyModel:
    """Everything one family's table holds on one node."""

    family: int
    node: NodeView
    ports: tuple[ServicePortView, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.family not in (4, 6):
            raise InvalidConfig("invalid key 'family'")

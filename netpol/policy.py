"""A ``networking.k8s.io/v1`` NetworkPolicy, parsed and validated as the API server does.

``parse_policy(manifest)`` takes the object kubectl would send (YAML or JSON, already loaded)
and returns a ``NetworkPolicy`` with the API's defaults applied: ``policyTypes`` absent is
``Ingress``, plus ``Egress`` when egress rules exist; a port's protocol absent is TCP. Every
problem is ``InvalidConfig`` naming the field as the API server does
(``spec.ingress[0].from[1].ipBlock.except[0]``). ``to_dict`` renders the object back (with the
defaults), which is what the store keeps.

What the rules mean is in ``evaluate.py``; the distinctions kept here are the API's own: a rule
list absent or empty (nothing allowed in that direction) against ``[{}]`` (everything); peers
or ports absent or empty (any) against given; one peer holding both selectors (AND) against
two peers (OR).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from netpol.selector import (
    EVERYTHING,
    SUBDOMAIN,
    LabelSelector,
    invalid,
    parse_selector,
    validate_known,
    validate_object,
)
from services.validate import DNS_LABEL

API_VERSION, KIND = "networking.k8s.io/v1", "NetworkPolicy"
PROTOCOLS = ("TCP", "UDP", "SCTP")
TYPES = ("Ingress", "Egress")
PORT_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$")  # IANA_SVC_NAME
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
CIDR_FORM = re.compile(r"[0-9A-Fa-f:.]+/[0-9]{1,3}")


@dataclass(frozen=True)
class IPBlock:
    cidr: Network
    excepts: tuple[Network, ...] = ()

    def holds(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return (
            ip.version == self.cidr.version
            and ip in self.cidr
            and not any(ip in e for e in self.excepts)
        )

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"cidr": str(self.cidr)}
        if self.excepts:
            doc["except"] = [str(e) for e in self.excepts]
        return doc


@dataclass(frozen=True)
class Peer:
    """Pods (``pod_selector`` in the policy's namespace, or in the namespaces
    ``namespace_selector`` picks) or addresses (``ip_block``)."""

    pod_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    ip_block: IPBlock | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.ip_block is not None:
            return {"ipBlock": self.ip_block.to_dict()}
        doc: dict[str, Any] = {}
        if self.pod_selector is not None:
            doc["podSelector"] = self.pod_selector.to_dict()
        if self.namespace_selector is not None:
            doc["namespaceSelector"] = self.namespace_selector.to_dict()
        return doc


@dataclass(frozen=True)
class PolicyPort:
    protocol: str = "TCP"
    port: int | str | None = None  # None: every port of the protocol; str: a named port
    end_port: int | None = None

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"protocol": self.protocol}
        if self.port is not None:
            doc["port"] = self.port
        if self.end_port is not None:
            doc["endPort"] = self.end_port
        return doc


@dataclass(frozen=True)
class Rule:
    peers: tuple[Peer, ...] = ()  # (): every source (ingress) or destination (egress)
    ports: tuple[PolicyPort, ...] = ()  # (): every port of every protocol

    def to_dict(self, peers_key: str) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        if self.peers:
            doc[peers_key] = [p.to_dict() for p in self.peers]
        if self.ports:
            doc["ports"] = [p.to_dict() for p in self.ports]
        return doc


@dataclass(frozen=True)
class NetworkPolicy:
    namespace: str
    name: str
    pod_selector: LabelSelector = EVERYTHING
    policy_types: tuple[str, ...] = ("Ingress",)
    ingress: tuple[Rule, ...] = ()
    egress: tuple[Rule, ...] = ()

    @functools.cached_property
    def ref(self) -> str:  # a sort key of every pass: made once
        return f"{self.namespace}/{self.name}"

    @functools.cached_property
    def port_names(self) -> frozenset[str]:
        """The named ports its rules use (read by every pass after a policy changed)."""
        return frozenset(
            port.port
            for rule in (*self.ingress, *self.egress)
            for port in rule.ports
            if isinstance(port.port, str)
        )

    def isolates(self, direction: str) -> bool:
        return direction in self.policy_types

    def to_dict(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "podSelector": self.pod_selector.to_dict(),
            "policyTypes": list(self.policy_types),
        }
        if self.ingress:
            spec["ingress"] = [r.to_dict("from") for r in self.ingress]
        if self.egress:
            spec["egress"] = [r.to_dict("to") for r in self.egress]
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"namespace": self.namespace, "name": self.name},
            "spec": spec,
        }


def parse_policy(manifest: Any, namespace: str = "default") -> NetworkPolicy:
    """``namespace``: the one a manifest without ``metadata.namespace`` goes to (kubectl's
    current namespace)."""
    if not isinstance(manifest, dict):
        raise invalid("<object>", "a NetworkPolicy is a JSON/YAML object")
    if manifest.get("apiVersion") != API_VERSION or manifest.get("kind") != KIND:
        raise invalid(
            "apiVersion/kind",
            f"expected {API_VERSION} {KIND}, got "
            f"{manifest.get('apiVersion')!r} {manifest.get('kind')!r}",
        )
    meta = manifest.get("metadata")
    if not isinstance(meta, dict):
        raise invalid("metadata", "required (name, namespace)")
    name = validate_subdomain(meta.get("name"), "metadata.name")
    ns = validate_name(meta.get("namespace") or namespace, "metadata.namespace")
    spec = manifest.get("spec")
    spec = {} if spec is None else spec  # optional: every field of it has its default
    if not isinstance(spec, dict):
        raise invalid("spec", "not an object")
    validate_known(spec, "spec", ("podSelector", "policyTypes", "ingress", "egress"))
    selector = parse_selector(spec.get("podSelector"), "spec.podSelector")  # absent: {}
    ingress = parse_rules(spec.get("ingress"), "spec.ingress", "from")
    egress = parse_rules(spec.get("egress"), "spec.egress", "to")
    types = parse_types(spec.get("policyTypes"), bool(egress))
    return NetworkPolicy(ns, name, selector, types, ingress, egress)


def validate_name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not DNS_LABEL.fullmatch(value):
        raise invalid(path, f"{value!r} is not a DNS label (a-z, 0-9, '-', at most 63)")
    return value


def validate_subdomain(value: Any, path: str) -> str:
    """A policy's name is a DNS subdomain (the API server's NameIsDNSSubdomain)."""
    if not isinstance(value, str) or len(value) > 253 or not SUBDOMAIN.fullmatch(value):
        raise invalid(path, f"{value!r} is not a DNS subdomain (a-z, 0-9, '-', '.', at most 253)")
    return value


def parse_types(value: Any, has_egress: bool) -> tuple[str, ...]:
    if value is None or value == []:
        return ("Ingress", "Egress") if has_egress else ("Ingress",)
    if not isinstance(value, list) or len(value) > 2:
        raise invalid("spec.policyTypes", "a list of at most Ingress and Egress")
    for index, item in enumerate(value):
        if item not in TYPES:
            raise invalid(f"spec.policyTypes[{index}]", f"{item!r} is not Ingress or Egress")
    return tuple(t for t in TYPES if t in value)


def parse_rules(value: Any, path: str, peers_key: str) -> tuple[Rule, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid(path, "not a list of rules")
    return tuple(parse_rule(r, f"{path}[{i}]", peers_key) for i, r in enumerate(value))


def parse_rule(value: Any, path: str, peers_key: str) -> Rule:
    if value is None:
        return Rule()
    if not isinstance(value, dict):
        raise invalid(path, "not an object (ports, from/to)")
    validate_known(value, path, ("ports", peers_key))
    peers, ports = optional_list(value, peers_key, path), optional_list(value, "ports", path)
    return Rule(
        tuple(parse_peer(p, f"{path}.{peers_key}[{i}]") for i, p in enumerate(peers)),
        tuple(parse_port(p, f"{path}.ports[{i}]") for i, p in enumerate(ports)),
    )


def optional_list(data: dict[str, Any], key: str, path: str) -> list[Any]:
    """A list field: absent or null is empty; any other type (an empty string or object
    included) is an error, as the API server's decoding makes it."""
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid(f"{path}.{key}", "not a list")
    return value


def parse_peer(value: Any, path: str) -> Peer:
    value = validate_object(value, path, ("podSelector", "namespaceSelector", "ipBlock"))
    pods, namespaces, block = (
        value.get("podSelector"),
        value.get("namespaceSelector"),
        value.get("ipBlock"),
    )
    if block is not None:
        if pods is not None or namespaces is not None:
            raise invalid(path, "may not specify more than 1 peer type (ipBlock with a selector)")
        return Peer(ip_block=parse_block(block, f"{path}.ipBlock"))
    if pods is None and namespaces is None:
        raise invalid(path, "must specify a peer (podSelector, namespaceSelector or ipBlock)")
    return Peer(
        optional_selector(pods, f"{path}.podSelector"),
        optional_selector(namespaces, f"{path}.namespaceSelector"),
    )


def optional_selector(value: Any, path: str) -> LabelSelector | None:
    """None when absent (not the empty selector: absent and {} mean different peers)."""
    return parse_selector(value, path) if value is not None else None


def parse_block(value: Any, path: str) -> IPBlock:
    value = validate_object(value, path, ("cidr", "except"))
    cidr = parse_cidr(value.get("cidr"), f"{path}.cidr")
    excepts = optional_list(value, "except", path)
    found = []
    for index, text in enumerate(excepts):
        at = f"{path}.except[{index}]"
        net = parse_cidr(text, at)
        if net.version != cidr.version or not net.subnet_of(cidr) or net == cidr:  # type: ignore[arg-type]
            raise invalid(at, f"must be a strict subset of cidr {cidr}")
        found.append(net)
    return IPBlock(cidr, tuple(found))


def parse_cidr(value: Any, path: str) -> Network:
    """ADDRESS/PREFIXLEN only, as Kubernetes parses a CIDR (no netmask, no zone)."""
    if not isinstance(value, str) or not CIDR_FORM.fullmatch(value):
        raise invalid(path, f"{value!r} is not a CIDR")
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise invalid(path, f"{value!r} is not a CIDR") from None


def parse_port(value: Any, path: str) -> PolicyPort:
    value = validate_object(value, path, ("protocol", "port", "endPort"))
    protocol = value.get("protocol")
    protocol = "TCP" if protocol is None else protocol  # only an absent one defaults
    if protocol not in PROTOCOLS:
        raise invalid(f"{path}.protocol", f"{protocol!r} is not one of TCP, UDP, SCTP")
    port, end = value.get("port"), value.get("endPort")
    if isinstance(port, bool) or (port is not None and not isinstance(port, (int, str))):
        raise invalid(f"{path}.port", f"{port!r} is not a number or a port name")
    if isinstance(port, int) and not 1 <= port <= 65535:
        raise invalid(f"{path}.port", f"{port} is not 1-65535")
    if isinstance(port, str) and (not PORT_NAME.fullmatch(port) or "--" in port):
        raise invalid(f"{path}.port", f"{port!r} is not a port name (IANA_SVC_NAME)")
    if end is not None:
        if isinstance(end, bool) or not isinstance(end, int) or not 1 <= end <= 65535:
            raise invalid(f"{path}.endPort", f"{end!r} is not 1-65535")
        if not isinstance(port, int):
            raise invalid(f"{path}.endPort", "may only be given with a numeric port")
        if end < port:
            raise invalid(f"{path}.endPort", f"must be greater than or equal to port {port}")
    return PolicyPort(str(protocol), port, end)

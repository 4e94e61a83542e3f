"""The verdict of a cluster's NetworkPolicies for one connection, with the reason (pure).

The inputs are what the API holds (``PolicyInputs``): Pods (namespace, name, addresses, labels,
node, named container ports with their protocol), Namespaces (labels; every namespace also
carries ``kubernetes.io/metadata.name``), the policies, and the nodes' addresses. The
connection is judged after Service DNAT: ``dst`` is the backend.

As NetworkPolicy v1 defines it: a Pod is isolated for ingress when a policy of its namespace
selects it and lists Ingress in policyTypes (egress likewise); an isolated direction allows
exactly the union of the rules of the policies isolating it, and a Pod no policy isolates
allows everything in that direction. A connection between Pods needs the source's egress and
the destination's ingress. A rule matches when a peer matches (none given: any) and a port
matches (none given: any). A peer's selectors: ``podSelector`` alone picks Pods of the policy's
namespace, ``namespaceSelector`` alone every Pod of the namespaces it picks, both in one peer
the Pods ``podSelector`` picks in those namespaces; ``ipBlock`` matches addresses inside its
CIDR and outside its excepts, Pods' addresses included. A port: its protocol (TCP by default),
and the number, the inclusive range to ``endPort``, or a name resolved on the destination Pod
(the selected Pod for ingress, the peer for egress; a name of another protocol or an address
that is no Pod matches nothing). Always allowed: a Pod to itself, and traffic from the
destination Pod's own node (kubelet's probes). Replies of an allowed connection are the
kernel's conntrack's business, not a verdict.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from netpol.policy import NetworkPolicy, Peer, PolicyPort, Rule

NAME_LABEL = "kubernetes.io/metadata.name"
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class NamedPort(NamedTuple):
    """A container port by name. A tuple: the caches keyed by a Pod's ports hash them in C
    (a frozen dataclass's hash is a Python call per port, 600 a relabel pass)."""

    name: str
    protocol: str  # TCP, UDP, SCTP
    port: int


def split_families(ips: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(IPv4, IPv6) addresses, canonical. An address already canonical is the given string,
    and a list already canonical and of one family the given tuple, not a copy."""
    found: tuple[list[str], list[str]] = ([], [])
    for text in ips:
        parsed = ipaddress.ip_address(text.split("/")[0])
        canonical = str(parsed)
        found[parsed.version == 6].append(text if canonical == text else canonical)
    v4, v6 = tuple(found[0]), tuple(found[1])
    if v4 == ips:
        return ips, ()
    if v6 == ips:
        return (), ips
    return v4, v6


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A Pod as policies see it. Slotted, with its two derived values kept in slots of their
    own: an instance dict per Pod, grown by cached properties, held ~2 MiB at 10,000 Pods."""

    namespace: str
    name: str
    ips: tuple[str, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    node: str = ""
    ports: tuple[NamedPort, ...] = ()
    _ref: str | None = field(default=None, init=False, repr=False, compare=False)
    _families: tuple[tuple[str, ...], tuple[str, ...]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def ref(self) -> str:
        """``namespace/name``, a sort key of every pass: made once."""
        found = self._ref
        if found is None:
            found = f"{self.namespace}/{self.name}"
            object.__setattr__(self, "_ref", found)
        return found

    @property
    def families(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(IPv4, IPv6) addresses, canonical, prefix cut: parsed once per Pod object, not
        once per peer that asks (``ipaddress`` parsing was two thirds of a layout at 1,000
        policies × 10,000 Pods), and kept with the Pod, not in a cache of every address list
        (2-3 MiB at 10,000 Pods)."""
        found = self._families
        if found is None:
            found = split_families(self.ips)
            object.__setattr__(self, "_families", found)
        return found

    def resolve(self, name: str, protocol: str) -> int | None:
        return next(
            (p.port for p in self.ports if p.name == name and p.protocol == protocol), None
        )


@dataclass(frozen=True)
class PolicyInputs:
    #: by ref (a tuple, or ``members.Flat``: made into one when first read)
    pods: Sequence[PodInfo] = ()
    namespaces: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    policies: Sequence[NetworkPolicy] = ()
    node_ips: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: ``pods`` by namespace when the source keeps them so (``view.PodCache``: an unchanged
    #: namespace's tuple is the same object from pass to pass); None: grouped when needed
    groups: Mapping[str, tuple[PodInfo, ...]] | None = field(
        default=None, compare=False, repr=False
    )
    #: ``policies`` by namespace, kept alike (``view.Records``); None: indexed when needed
    policy_groups: Mapping[str, tuple[NetworkPolicy, ...]] | None = field(
        default=None, compare=False, repr=False
    )

    def namespace_labels(self, namespace: str) -> dict[str, str]:
        return {**self.namespaces.get(namespace, {}), NAME_LABEL: namespace}

    @functools.cached_property
    def policies_in(self) -> Mapping[str, tuple[NetworkPolicy, ...]]:
        """The policies by namespace (a policy selects Pods of its own namespace only)."""
        if self.policy_groups is not None:
            return self.policy_groups
        found: dict[str, list[NetworkPolicy]] = {}
        for policy in self.policies:
            found.setdefault(policy.namespace, []).append(policy)
        return {ns: tuple(found_ns) for ns, found_ns in found.items()}

    @functools.cached_property
    def by_address(self) -> dict[IPAddress, PodInfo]:
        return {_ip(ip): pod for pod in self.pods for ip in pod.ips}

    def pod_at(self, ip: IPAddress) -> PodInfo | None:
        return self.by_address.get(ip)

    def node_of(self, ip: IPAddress) -> str | None:
        return next(
            (n for n, ips in self.node_ips.items() if any(_ip(i) == ip for i in ips)), None
        )


@dataclass(frozen=True)
class Decision:
    """One direction at one Pod: the policies isolating it, and the (policy, rule index)
    pairs that allow the connection."""

    direction: str
    pod: str | None  # None: the end is not a Pod (no policy applies)
    isolating: tuple[str, ...] = ()
    allowed_by: tuple[tuple[str, int], ...] = ()
    exempt: str = ""  # why it is allowed whatever the policies say

    @property
    def allowed(self) -> bool:
        return bool(self.exempt) or not self.isolating or bool(self.allowed_by)

    def to_dict(self) -> dict[str, Any]:
        return {
            "direction": self.direction,
            "pod": self.pod,
            "isolated": bool(self.isolating),
            "isolatingPolicies": list(self.isolating),
            "allowedBy": [{"policy": p, "rule": r} for p, r in self.allowed_by],
            "exempt": self.exempt or None,
            "allowed": self.allowed,
        }


@dataclass(frozen=True)
class Verdict:
    egress: Decision
    ingress: Decision

    @property
    def allowed(self) -> bool:
        return self.egress.allowed and self.ingress.allowed

    def to_dict(self) -> dict[str, Any]:
        return {
            "allowed": self.allowed,
            "egress": self.egress.to_dict(),
            "ingress": self.ingress.to_dict(),
        }


def selects(policy: NetworkPolicy, pod: PodInfo) -> bool:
    return policy.namespace == pod.namespace and policy.pod_selector.matches(pod.labels)


def policies_of(inputs: PolicyInputs, pod: PodInfo, direction: str) -> list[NetworkPolicy]:
    """The policies isolating ``pod`` in ``direction``, by namespace/name."""
    mine = inputs.policies_in.get(pod.namespace, ())
    found = [p for p in mine if p.isolates(direction) and selects(p, pod)]
    return sorted(found, key=lambda p: p.ref)


def evaluate(inputs: PolicyInputs, src: str, dst: str, protocol: str, port: int) -> Verdict:
    """``protocol``: TCP, UDP or SCTP; ``port``: the destination port (after DNAT)."""
    src_ip, dst_ip = _ip(src), _ip(dst)
    source, target = inputs.pod_at(src_ip), inputs.pod_at(dst_ip)
    egress = decide(inputs, "Egress", source, target, dst_ip, protocol, port)
    ingress = decide(inputs, "Ingress", target, source, src_ip, protocol, port)
    return Verdict(egress, ingress)


def decide(
    inputs: PolicyInputs,
    direction: str,
    pod: PodInfo | None,
    peer: PodInfo | None,
    peer_ip: IPAddress,
    protocol: str,
    port: int,
) -> Decision:
    if pod is None:
        return Decision(direction, None)
    isolating = policies_of(inputs, pod, direction)
    refs = tuple(p.ref for p in isolating)
    exempt = calc_exempt(inputs, direction, pod, peer, peer_ip)
    if exempt:
        return Decision(direction, pod.ref, refs, exempt=exempt)
    destination = pod if direction == "Ingress" else peer
    allowed = tuple(
        (policy.ref, index)
        for policy in isolating
        for index, rule in enumerate(policy.ingress if direction == "Ingress" else policy.egress)
        if rule_matches(inputs, policy, rule, peer, peer_ip, destination, protocol, port)
    )
    return Decision(direction, pod.ref, refs, allowed)


def calc_exempt(
    inputs: PolicyInputs,
    direction: str,
    pod: PodInfo,
    peer: PodInfo | None,
    peer_ip: IPAddress,
) -> str:
    """Why the connection is allowed at ``pod`` whatever its policies say ("": it is not)."""
    if peer is pod:
        return "a Pod to itself"
    if pod.node and inputs.node_of(peer_ip) == pod.node:
        return "to its own node" if direction == "Egress" else "from its own node"
    return ""


def rule_matches(
    inputs: PolicyInputs,
    policy: NetworkPolicy,
    rule: Rule,
    peer: PodInfo | None,
    peer_ip: IPAddress,
    destination: PodInfo | None,
    protocol: str,
    port: int,
) -> bool:
    peers_ok = not rule.peers or any(
        peer_matches(inputs, policy, p, peer, peer_ip) for p in rule.peers
    )
    ports_ok = not rule.ports or any(
        port_matches(p, destination, protocol, port) for p in rule.ports
    )
    return peers_ok and ports_ok


def peer_matches(
    inputs: PolicyInputs,
    policy: NetworkPolicy,
    peer: Peer,
    pod: PodInfo | None,
    ip: IPAddress,
) -> bool:
    if peer.ip_block is not None:
        return peer.ip_block.holds(ip)
    if pod is None:
        return False
    if peer.namespace_selector is None:
        in_namespace = pod.namespace == policy.namespace
    else:
        in_namespace = peer.namespace_selector.matches(inputs.namespace_labels(pod.namespace))
    return in_namespace and (peer.pod_selector is None or peer.pod_selector.matches(pod.labels))


def port_matches(spec: PolicyPort, destination: PodInfo | None, protocol: str, port: int) -> bool:
    if spec.protocol != protocol:
        return False
    if spec.port is None:
        return True
    if isinstance(spec.port, str):
        return destination is not None and destination.resolve(spec.port, protocol) == port
    return spec.port <= port <= (spec.end_port or spec.port)


def _ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text.split("/")[0])


def pod_infos(pods: Iterable[PodInfo]) -> tuple[PodInfo, ...]:
    return tuple(sorted(pods, key=lambda p: p.ref))

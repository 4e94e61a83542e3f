"""Explain what a packet meets in the proxy's table, from the same model the renderer reads.

The walk follows the ruleset's order: the load balancer source-range firewall (before DNAT),
masquerade marks, then the ``service-ips`` dispatch
(ClusterIP, then externalIP), the NodePort dispatch, and last the filter checks (no endpoints,
unknown port of a known VIP, unallocated service address). Entries and backends come from
``calc_entries`` / ``calc_backends``, the functions that render the elements. A client in the
cluster CIDRs, or the node itself (one of its NodePort addresses, or loopback: the addresses
the tracer knows of ``fib saddr type local``), meets a Local-policy external entry's
short-circuit dispatch first: every backend, the node's own traffic masqueraded.

Which clients are the cluster's Pods is the node's ``detectLocalMode``: a source in the
cluster CIDRs, or (``BridgeInterface``) a packet that came in on the bridge: ``iif`` names the
interface; not given, a source in the cluster CIDRs is taken to come in on the bridge and any
other not to, and the answer says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from services.proxy.elements import calc_entries, calc_firewall_sources
from services.proxy.model import (
    LOOPBACK,
    Backend,
    IPAddress,
    NodeView,
    ProxyModel,
    ServicePortView,
)


@dataclass(frozen=True)
class Choice:
    """One backend the packet may go to, its probability and whether its source is masqueraded."""

    ip: str
    port: int
    node: str
    probability: float
    masquerade: bool
    why: tuple[str, ...] = ()


@dataclass(frozen=True)
class Answer:
    """What the table does with the packet: entry matched, verdict, choices, reasons."""

    entry: str  # ClusterIP | externalIP | LoadBalancerIP | NodePort | none
    verdict: str  # dnat | reject | drop | accept (not a Service)
    service: str | None = None
    reason: str = ""
    sticky: bool = False
    affinity_timeout: int | None = None
    choices: tuple[Choice, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def explain(
    model: ProxyModel,
    node: NodeView,
    src_ip: IPAddress,
    src_port: int,
    dst_ip: IPAddress,
    dst_port: int,
    proto: str,
    iif: str | None = None,
) -> Answer:
    """The tracer: ``node`` is the node whose table is asked (its NodePort addresses);
    ``iif`` the interface the packet comes in on ("" for the node's own, None: unknown)."""
    model = ProxyModel(model.family, node, model.ports)
    client = calc_client(src_ip, node, iif)
    for view in model.ports:
        if view.port.protocol != proto:
            continue
        for entry, key, external in calc_entries(view, model):
            if _matches(entry, key, view, dst_ip, dst_port, model):
                return _answer(view, entry, external, client, dst_ip, model)
    return _miss(model, dst_ip)


@dataclass(frozen=True)
class Client:
    """The packet's source as the ruleset tells it: pod (local traffic by the node's
    detectLocalMode), node (``fib saddr type local``) or external; ``assumed``: how an unknown
    input interface was taken under BridgeInterface."""

    ip: IPAddress
    source: str
    assumed: str = ""


def calc_client(src_ip: IPAddress, node: NodeView, iif: str | None) -> Client:
    in_cidrs = any(src_ip in n for n in node.cluster_cidrs if n.version == src_ip.version)
    assumed = ""
    if node.local_bridge is None:
        local = in_cidrs
    elif iif is not None:
        local = iif.startswith(node.local_bridge)
    else:
        local = in_cidrs
        where = "in on" if in_cidrs else "not in on"
        assumed = f"taken as {where} a {node.local_bridge}* bridge (--iif tells)"
    if local:
        return Client(src_ip, "pod", assumed)
    if src_ip in node.node_ips or src_ip in LOOPBACK[src_ip.version]:
        return Client(src_ip, "node")
    return Client(src_ip, "external", assumed)


def _matches(
    entry: str,
    key: str,
    view: ServicePortView,
    dst_ip: IPAddress,
    dst_port: int,
    model: ProxyModel,
) -> bool:
    if entry == "np":
        return dst_ip in model.node.node_ips and dst_port == view.port.node_port
    return key.split(" . ")[0] == str(dst_ip) and dst_port == view.port.port


def _label(view: ServicePortView, entry: str, external: bool, dst_ip: IPAddress) -> str:
    if entry == "np":
        return "NodePort"
    if not external:
        return "ClusterIP"
    lb = dst_ip in view.service.load_balancer_ips and dst_ip not in view.service.external_ips
    return "LoadBalancerIP" if lb else "externalIP"


def _answer(
    view: ServicePortView,
    entry: str,
    external: bool,
    client: Client,
    dst_ip: IPAddress,
    model: ProxyModel,
) -> Answer:
    name = f"{view.service.namespace}/{view.service.name}:{view.port.name or view.port.port}"
    source = client.source
    short = view.is_short_circuit(external) and source != "external"
    label, backends = _label(view, entry, external, dst_ip), view.calc_backends(external, short)
    if _is_fenced(view, dst_ip, client.ip, model):
        return Answer(label, "drop", name, "the client is outside loadBalancerSourceRanges")
    if not backends:
        return _no_backends(view, label, name, external)
    timeout = view.service.affinity_timeout
    choices = tuple(
        _choice(b, 1 / len(backends), view, external, client, model, short and source == "node")
        for b in backends
    )
    reasons = [f"externalTrafficPolicy Local does not apply to {SOURCES[source]}"] if short else []
    if client.assumed and (short or not external):
        reasons.append(client.assumed)
    reason = "; ".join(reasons)
    if not backends[0].ready:
        fallback = "no ready endpoint: the serving terminating ones"
        reason = f"{reason}; {fallback}" if reason else fallback
    return Answer(label, "dnat", name, reason, bool(timeout), timeout, choices)


def _is_fenced(
    view: ServicePortView, dst_ip: IPAddress, src_ip: IPAddress, model: ProxyModel
) -> bool:
    """The pre-DNAT firewall: a load balancer IP with source ranges, a client outside them."""
    if dst_ip not in view.service.load_balancer_ips:
        return False
    sources = calc_firewall_sources(view, model)
    return bool(sources) and not any(src_ip in n for n in sources)


SOURCES = {"pod": "a Pod client (local traffic)", "node": "the node's own traffic"}


def _no_backends(view: ServicePortView, label: str, name: str, external: bool) -> Answer:
    if view.backends and view.is_local_policy(external):
        policy = "externalTrafficPolicy" if external else "internalTrafficPolicy"
        return Answer(label, "drop", name, f"{policy} Local and no endpoint on this node")
    return Answer(label, "reject", name, "no endpoints")


def _choice(
    b: Backend,
    p: float,
    view: ServicePortView,
    external: bool,
    client: Client,
    model: ProxyModel,
    from_node: bool = False,
) -> Choice:
    why = []
    if b.ip == client.ip:
        why.append("hairpin: the client is this endpoint")
    if from_node:
        why.append("the node's own traffic to a Local-policy external entry")
    if external and not view.service.external_local:
        why.append("external traffic under Cluster policy")
    if not external and model.node.masquerade_all:
        why.append("masqueradeAll")
    elif not external and client.source != "pod":
        bridge = model.node.local_bridge
        why.append(
            f"client not in on a {bridge}* bridge"
            if bridge
            else "client outside the cluster CIDRs"
        )
    return Choice(str(b.ip), b.port, b.node, p, bool(why), tuple(why))


def _miss(model: ProxyModel, dst_ip: IPAddress) -> Answer:
    if any(dst_ip in view.service.vips for view in model.ports):
        return Answer("none", "reject", None, "unknown port of a known Service IP")
    if any(dst_ip in n for n in model.node.service_cidrs if n.version == dst_ip.version):
        return Answer("none", "drop", None, "unallocated address of a service CIDR")
    return Answer("none", "accept", None, "not a Service address")


def render_answer(a: Answer) -> str:
    """The readable form for `pycni svc trace`."""
    head = f"{a.entry} {a.service or ''}".strip()
    lines = [f"{head}: {a.verdict}" + (f" ({a.reason})" if a.reason else "")]
    if a.sticky:
        lines.append(
            f"  ClientIP affinity: sticky for {a.affinity_timeout}s after the first choice"
        )
    for c in a.choices:
        masq = "masquerade: " + "; ".join(c.why) if c.masquerade else "client IP kept"
        lines.append(f"  -> {c.ip}:{c.port} on {c.node}  p={c.probability:.3f}  {masq}")
    return "\n".join(lines) + "\n"

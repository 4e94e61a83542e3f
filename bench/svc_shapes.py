"""The two rulesets `make bench-svc` loads, over one address plan.

Both shapes serve the same Services: N ClusterIP Services (TCP 80, Cluster policy) with
``ENDPOINTS`` backends each, off-cluster clients and hairpin traffic masqueraded.

- pycni: the real proxy pass (``services.proxy``) over the store records pycnid would hold
  (``build_records``), each Service selecting its 5 endpoints by label; ``build_model`` is
  the same Services as a model for the unit tests;
- kube-proxy: the shape of kube-proxy's nftables mode, generated here: per service port one
  ``service-`` chain (masquerade rule + inline ``numgen random mod N vmap``) and one
  ``endpoint-`` chain per endpoint (hairpin mark + dnat), dispatched by the ``service-ips``
  verdict map. The update is kube-proxy's own: add the new endpoint chain, flush and refill the
  service chain, flush and delete the old endpoint chain, in one transaction.

Address plan (the one kube-proxy's own unit tests use): ClusterIPs 172.30.0.0/16, Pods
10.0.0.0/8, node 192.168.0.2.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from dataclasses import replace

from services.proxy.model import (
    Backend,
    NodeView,
    ProxyModel,
    ProxyPort,
    ProxyService,
    ServicePortView,
)
from services.proxy.view import Records
from services.record import EndpointRecord, ServicePort, ServiceRecord, ServiceSettings
from store.base import KV

ENDPOINTS = 5
NODES = 100
PORT, TARGET = 80, 8080
VIPS = ipaddress.ip_network("172.30.0.0/16")
PODS = ipaddress.ip_network("10.0.0.0/8")
SPARE = ipaddress.ip_network("10.255.0.0/16")  # the endpoint an update swaps in
NODE = NodeView("n1", (ipaddress.ip_address("192.168.0.2"),), (PODS,), (VIPS,))
KUBE = "ip kube-proxy"
Plan = list[tuple[str, ipaddress.IPv4Address, list[ipaddress.IPv4Address]]]


def calc_plan(services: int) -> Plan:
    """(name, ClusterIP, endpoint IPs) of every Service; addresses unique in the run."""
    if services >= VIPS.num_addresses - 2:
        raise ValueError(f"at most {VIPS.num_addresses - 2} Services fit {VIPS}")
    base = int(PODS.network_address) + 256
    return [
        (
            f"svc{i}",
            VIPS[i + 1],
            [ipaddress.IPv4Address(base + i * ENDPOINTS + j) for j in range(ENDPOINTS)],
        )
        for i in range(services)
    ]


def calc_swap(plan: Plan, round_: int) -> Plan:
    """The plan with endpoint 0 of the middle Service swapped for a spare address, or back."""
    if round_ % 2 == 0:
        return plan
    i = len(plan) // 2
    name, vip, eps = plan[i]
    return plan[:i] + [(name, vip, [SPARE[1 + i % 60000], *eps[1:]])] + plan[i + 1 :]


# --- pycni ------------------------------------------------------------------------------------


def build_model(plan: Plan) -> ProxyModel:
    return ProxyModel(4, NODE, tuple(_view(name, vip, eps) for name, vip, eps in plan))


def _view(name: str, vip: ipaddress.IPv4Address, eps: list) -> ServicePortView:
    svc = ProxyService("bench", name, (vip,), ports=(ProxyPort("http", "tcp", PORT),))
    return ServicePortView(svc, svc.ports[0], tuple(Backend(ip, TARGET, "n1", True) for ip in eps))


def build_records(plan: Plan) -> Records:
    """The same Services as store records, as pycnid's proxy holds them (each Service selects
    its own endpoints by label), with the node's pools and service CIDR."""
    records = Records()
    records.pools["bench"] = str(PODS)
    records.settings = ServiceSettings((str(VIPS),))
    for name, vip, eps in plan:
        svc = ServiceRecord(
            "bench",
            name,
            ports=(ServicePort("http", "TCP", PORT, TARGET),),
            cluster_ips=(str(vip),),
            selector={"svc": name},
        )
        records.apply(KV(svc.key, svc.to_bytes(), 0))
        for j, ip in enumerate(eps):
            records.apply(_endpoint_kv(name, j, ip))
    return records


def swap_records(records: Records, old: Plan, new: Plan) -> None:
    """Apply the endpoint records that differ between two plans (a watch event each)."""
    for (name, _vip, eps0), (_n, _v, eps1) in zip(old, new, strict=True):
        for j, (ip0, ip1) in enumerate(zip(eps0, eps1, strict=True)):
            if ip0 != ip1:
                records.apply(_endpoint_kv(name, j, ip1))


def _endpoint_kv(name: str, j: int, ip: ipaddress.IPv4Address) -> KV:
    ep = EndpointRecord(
        "bench", f"{name}-{j}", "eth0", (str(ip),), {"svc": name}, calc_endpoint_node(ip)
    )
    return KV(ep.key, ep.to_bytes(), 0)


def calc_endpoint_node(ip: ipaddress.IPv4Address) -> str:
    """Endpoints are spread over ``NODES`` nodes; the measured node is ``n1`` (one in
    ``NODES`` of them is local: 500 at 10k Services, already 4.5x kubelet's default
    max-pods). Locality matters to pycni only for hairpin, kept for local endpoints alone;
    the kube-proxy shape renders its hairpin rule in every endpoint chain, as kube-proxy
    does."""
    return f"n{int(ip) % NODES + 1}"


def swap_model(model: ProxyModel, plan: Plan) -> ProxyModel:
    """``model`` with the middle port view rebuilt from ``plan`` (the one-Service update)."""
    i = len(plan) // 2
    ports = list(model.ports)
    ports[i] = _view(*plan[i])
    return replace(model, ports=tuple(ports))


# --- kube-proxy shape ------------------------------------------------------------------------


def calc_hash(name: str) -> str:
    """kube-proxy's chain-name hash: sha256 -> base32, first 8 characters."""
    return base64.b32encode(hashlib.sha256(name.encode()).digest()).decode()[:8]


def service_chain(name: str) -> str:
    port = f"bench/{name}/tcp/p{PORT}"
    return f"service-{calc_hash(port)}-{port}"


def endpoint_chain(name: str, ip: ipaddress.IPv4Address) -> str:
    port = f"bench/{name}/tcp/p{PORT}__{ip}/{TARGET}"
    return f"endpoint-{calc_hash(port)}-{port}"


def render_kube_skeleton() -> str:
    """The 10 static chains, the dispatch and no-endpoint maps, masquerading."""
    base = (
        ("nat-prerouting", "nat hook prerouting priority -100"),
        ("nat-output", "nat hook output priority -100"),
        ("nat-postrouting", "nat hook postrouting priority 100"),
        ("filter-forward", "filter hook forward priority 0"),
        ("filter-output", "filter hook output priority 0"),
    )
    key = "ipv4_addr . inet_proto . inet_service : verdict"
    lines = [
        f"add table {KUBE}",
        f"add map {KUBE} service-ips {{ type {key}; }}",
        f"add map {KUBE} no-endpoint-services {{ type {key}; }}",
    ]
    lines += [f"add chain {KUBE} {c} {{ type {h}; policy accept; }}" for c, h in base]
    lines += [
        f"add chain {KUBE} {c}"
        for c in (
            "services",
            "mark-for-masquerade",
            "masquerading",
            "service-endpoints-check",
            "reject-chain",
        )
    ]
    lines += [f"add rule {KUBE} {chain} {rule}" for chain, rule in _kube_static_rules()]
    return "\n".join(lines) + "\n"


def _kube_static_rules() -> list[tuple[str, str]]:
    dispatch = "ip daddr . meta l4proto . th dport vmap"
    return [
        ("nat-prerouting", "jump services"),
        ("nat-output", "jump services"),
        ("nat-postrouting", "jump masquerading"),
        ("filter-forward", "ct state new jump service-endpoints-check"),
        ("filter-output", "ct state new jump service-endpoints-check"),
        ("services", f"{dispatch} @service-ips"),
        ("service-endpoints-check", f"{dispatch} @no-endpoint-services"),
        ("mark-for-masquerade", "meta mark set meta mark | 0x4000"),
        ("masquerading", "meta mark & 0x4000 == 0 return"),
        ("masquerading", "meta mark set meta mark ^ 0x4000"),
        ("masquerading", "masquerade fully-random"),
        ("reject-chain", "reject"),
    ]


def render_endpoint(name: str, ip: ipaddress.IPv4Address) -> str:
    chain = endpoint_chain(name, ip)
    return (
        f"add chain {KUBE} {chain}\n"
        f"add rule {KUBE} {chain} ip saddr {ip} jump mark-for-masquerade\n"
        f"add rule {KUBE} {chain} meta l4proto tcp dnat to {ip}:{TARGET}\n"
    )


def render_service_rules(name: str, vip: ipaddress.IPv4Address, eps: list) -> str:
    chain = service_chain(name)
    picks = ", ".join(f"{j} : goto {endpoint_chain(name, ip)}" for j, ip in enumerate(eps))
    return (
        f"add rule {KUBE} {chain} ip daddr {vip} tcp dport {PORT} ip saddr != {PODS} "
        f"jump mark-for-masquerade\n"
        f"add rule {KUBE} {chain} numgen random mod {len(eps)} vmap {{ {picks} }}\n"
    )


def render_kube_service(name: str, vip: ipaddress.IPv4Address, eps: list) -> str:
    """One Service: its endpoint chains, its service chain, its ``service-ips`` element."""
    chain = service_chain(name)
    return (
        "".join(render_endpoint(name, ip) for ip in eps)
        + f"add chain {KUBE} {chain}\n"
        + render_service_rules(name, vip, eps)
        + f"add element {KUBE} service-ips {{ {vip} . tcp . {PORT} : goto {chain} }}\n"
    )


def render_kube_full(plan: Plan) -> str:
    return render_kube_skeleton() + "".join(render_kube_service(*s) for s in plan)


def render_kube_update(old: Plan, new: Plan) -> str:
    """kube-proxy's transaction for the Services whose endpoints changed between two plans."""
    out = []
    for (name, vip, eps0), (_n, _v, eps1) in zip(old, new, strict=True):
        if eps0 == eps1:
            continue
        gone = [ip for ip in eps0 if ip not in eps1]
        out += [render_endpoint(name, ip) for ip in eps1 if ip not in eps0]
        out += [
            f"flush chain {KUBE} {service_chain(name)}\n",
            render_service_rules(name, vip, eps1),
        ]
        out += [
            f"flush chain {KUBE} {endpoint_chain(name, ip)}\n"
            f"delete chain {KUBE} {endpoint_chain(name, ip)}\n"
            for ip in gone
        ]
    return "".join(out)

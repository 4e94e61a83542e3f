"""The kube-proxy shape `make bench-svc` loads: kube-proxy's nftables layout, generated here
for the Services of bench/svc_shapes.py (the same Services as pycni's side).

The static part: the ``services`` dispatch (``service-ips`` by address, ``service-nodeports``
for the addresses in ``nodeport-ips``), the no-endpoint checks (``no-endpoint-services``,
``no-endpoint-nodeports``), the ``cluster-ips`` check, ``firewall-check`` over the
``firewall-ips`` map before DNAT, masquerading by mark. Per service port:

- ``service-<port>``: masquerade of off-cluster clients of the ClusterIP; under ClientIP
  affinity one ``ip saddr @affinity-<endpoint> goto endpoint-<endpoint>`` rule per endpoint;
  then ``numgen random mod N vmap`` over the endpoint chains;
- ``local-<port>`` (externalTrafficPolicy Local, with local endpoints): the same over the
  local endpoints, no masquerade;
- ``external-<port>`` (NodePort and LoadBalancer: their nodePort and load balancer IP go
  there): Cluster policy marks and goes to ``service-``; Local policy short-circuits Pods
  (``ip saddr <pod CIDR>``) and the node's own traffic (``fib saddr type local``, marked) to
  ``service-``, the rest to ``local-``;
- ``firewall-<port>`` (loadBalancerSourceRanges): ``ip saddr != { ranges } drop``, reached
  through its load balancer IP's ``firewall-ips`` element;
- ``endpoint-<endpoint>``: hairpin mark, under affinity ``update @affinity-<endpoint>``
  (a set per endpoint: dynamic, timeout 10800 s), dnat.

The update is kube-proxy's own for one Service whose endpoint changed, at its smallest: add the
new endpoint's chain (and affinity set), flush and refill the chains that pick endpoints
(``service-``, ``local-``), flush and delete the old endpoint's chain (and set), in one
transaction. kube-proxy re-writes every chain of a changed Service; leaving the unchanged ones
out favours it.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress

from .svc_shapes import (
    NODE,
    PODS,
    PORT,
    TARGET,
    VIPS,
    BenchService,
    Plan,
    calc_endpoint_nodes,
)

KUBE = "ip kube-proxy"
AFFINITY_TIMEOUT = 10800
DISPATCH = "ip daddr . meta l4proto . th dport vmap"
NODEPORT = "ip daddr @nodeport-ips meta l4proto . th dport vmap"
BASE_CHAINS = (
    ("nat-prerouting", "nat hook prerouting priority -100"),
    ("nat-output", "nat hook output priority -100"),
    ("nat-postrouting", "nat hook postrouting priority 100"),
    ("filter-prerouting-pre-dnat", "filter hook prerouting priority -110"),
    ("filter-output-pre-dnat", "filter hook output priority -110"),
    ("filter-input", "filter hook input priority 0"),
    ("filter-forward", "filter hook forward priority 0"),
    ("filter-output", "filter hook output priority 0"),
)
HELPER_CHAINS = (
    "services",
    "mark-for-masquerade",
    "masquerading",
    "service-endpoints-check",
    "nodeport-endpoints-check",
    "cluster-ips-check",
    "firewall-check",
    "reject-chain",
)
STATIC_CHAINS = len(BASE_CHAINS) + len(HELPER_CHAINS)


def calc_hash(name: str) -> str:
    """kube-proxy's chain-name hash: sha256 -> base32, first 8 characters."""
    return base64.b32encode(hashlib.sha256(name.encode()).digest()).decode()[:8]


def _port_base(name: str) -> str:
    port = f"bench/{name}/tcp/p{PORT}"
    return f"{calc_hash(port)}-{port}"


def _endpoint_base(name: str, ip: ipaddress.IPv4Address) -> str:
    port = f"bench/{name}/tcp/p{PORT}__{ip}/{TARGET}"
    return f"{calc_hash(port)}-{port}"


def service_chain(name: str) -> str:
    return f"service-{_port_base(name)}"


def local_chain(name: str) -> str:
    return f"local-{_port_base(name)}"


def external_chain(name: str) -> str:
    return f"external-{_port_base(name)}"


def firewall_chain(name: str) -> str:
    return f"firewall-{_port_base(name)}"


def endpoint_chain(name: str, ip: ipaddress.IPv4Address) -> str:
    return f"endpoint-{_endpoint_base(name, ip)}"


def affinity_set(name: str, ip: ipaddress.IPv4Address) -> str:
    return f"affinity-{_endpoint_base(name, ip)}"


def local_endpoints(svc: BenchService) -> list[ipaddress.IPv4Address]:
    nodes = calc_endpoint_nodes(svc)
    return [ip for ip, node in zip(svc.eps, nodes, strict=True) if node == NODE.node]


# --- the static part -----------------------------------------------------------------------


def render_skeleton() -> str:
    """The static chains, sets and maps, the node's address in ``nodeport-ips``."""
    key = "ipv4_addr . inet_proto . inet_service : verdict"
    maps = ("service-ips", "no-endpoint-services", "firewall-ips")
    port_maps = ("service-nodeports", "no-endpoint-nodeports")
    lines = [f"add table {KUBE}"]
    lines += [f"add map {KUBE} {m} {{ type {key}; }}" for m in maps]
    lines += [
        f"add map {KUBE} {m} {{ type inet_proto . inet_service : verdict; }}" for m in port_maps
    ]
    lines += [f"add set {KUBE} {s} {{ type ipv4_addr; }}" for s in ("nodeport-ips", "cluster-ips")]
    lines += [f"add chain {KUBE} {c} {{ type {h}; policy accept; }}" for c, h in BASE_CHAINS]
    lines += [f"add chain {KUBE} {c}" for c in HELPER_CHAINS]
    lines += [f"add rule {KUBE} {chain} {rule}" for chain, rule in _static_rules()]
    lines += [f"add element {KUBE} nodeport-ips {{ {ip} }}" for ip in NODE.node_ips]
    return "\n".join(lines) + "\n"


def _static_rules() -> list[tuple[str, str]]:
    new = "ct state new jump"
    return [
        ("nat-prerouting", "jump services"),
        ("nat-output", "jump services"),
        ("nat-postrouting", "jump masquerading"),
        ("filter-prerouting-pre-dnat", f"{new} firewall-check"),
        ("filter-output-pre-dnat", f"{new} firewall-check"),
        ("filter-input", f"{new} nodeport-endpoints-check"),
        ("filter-input", f"{new} service-endpoints-check"),
        ("filter-forward", f"{new} service-endpoints-check"),
        ("filter-forward", f"{new} cluster-ips-check"),
        ("filter-output", f"{new} service-endpoints-check"),
        ("filter-output", f"{new} cluster-ips-check"),
        ("services", f"{DISPATCH} @service-ips"),
        ("services", f"{NODEPORT} @service-nodeports"),
        ("service-endpoints-check", f"{DISPATCH} @no-endpoint-services"),
        ("nodeport-endpoints-check", f"{NODEPORT} @no-endpoint-nodeports"),
        ("cluster-ips-check", "ip daddr @cluster-ips reject"),
        ("cluster-ips-check", f"ip daddr {VIPS} drop"),
        ("firewall-check", f"{DISPATCH} @firewall-ips"),
        ("mark-for-masquerade", "meta mark set meta mark | 0x4000"),
        ("masquerading", "meta mark & 0x4000 == 0 return"),
        ("masquerading", "meta mark set meta mark ^ 0x4000"),
        ("masquerading", "masquerade fully-random"),
        ("reject-chain", "reject"),
    ]


# --- per Service -----------------------------------------------------------------------------


def render_endpoint(svc: BenchService, ip: ipaddress.IPv4Address) -> str:
    """An endpoint's chain (and its affinity set first: the chain names it)."""
    chain = endpoint_chain(svc.name, ip)
    out = []
    if svc.affinity:
        s = affinity_set(svc.name, ip)
        out.append(
            f"add set {KUBE} {s} {{ type ipv4_addr; flags dynamic,timeout; "
            f"timeout {AFFINITY_TIMEOUT}s; }}\n"
        )
        update = [f"update @{s} {{ ip saddr }}"]
    else:
        update = []
    out.append(f"add chain {KUBE} {chain}\n")
    rules = [
        f"ip saddr {ip} jump mark-for-masquerade",
        *update,
        f"meta l4proto tcp dnat to {ip}:{TARGET}",
    ]
    out += [f"add rule {KUBE} {chain} {rule}\n" for rule in rules]
    return "".join(out)


def render_pick_rules(svc: BenchService, chain: str, eps: list[ipaddress.IPv4Address]) -> str:
    """A policy chain's endpoint choice: affinity lookups, then a random endpoint."""
    out = []
    if svc.affinity:
        out += [
            f"ip saddr @{affinity_set(svc.name, ip)} goto {endpoint_chain(svc.name, ip)}"
            for ip in eps
        ]
    picks = ", ".join(f"{j} : goto {endpoint_chain(svc.name, ip)}" for j, ip in enumerate(eps))
    out.append(f"numgen random mod {len(eps)} vmap {{ {picks} }}")
    return "".join(f"add rule {KUBE} {chain} {rule}\n" for rule in out)


def render_service_rules(svc: BenchService) -> str:
    """The Cluster policy chain: the ClusterIP's masquerade rule, then the choice."""
    chain = service_chain(svc.name)
    masq = (
        f"add rule {KUBE} {chain} ip daddr {svc.vip} tcp dport {PORT} ip saddr != {PODS} "
        f"jump mark-for-masquerade\n"
    )
    return masq + render_pick_rules(svc, chain, list(svc.eps))


def render_external_rules(svc: BenchService) -> str:
    chain, to_service = external_chain(svc.name), f"goto {service_chain(svc.name)}"
    if not svc.local:
        rules = ["jump mark-for-masquerade", to_service]
    else:
        rules = [
            f"ip saddr {PODS} {to_service}",
            "fib saddr type local jump mark-for-masquerade",
            f"fib saddr type local {to_service}",
        ]
        rules += [f"goto {local_chain(svc.name)}"] if local_endpoints(svc) else []
    return "".join(f"add rule {KUBE} {chain} {rule}\n" for rule in rules)


def render_firewall_rules(svc: BenchService) -> str:
    """Who may reach the load balancer IP (no range holds the node: no LB IP added)."""
    ranges = ", ".join(svc.ranges)
    return f"add rule {KUBE} {firewall_chain(svc.name)} ip saddr != {{ {ranges} }} drop\n"


def render_service(svc: BenchService) -> str:
    """One Service: endpoint chains first (the policy chains name them), its chains, then
    its elements."""
    out = [render_endpoint(svc, ip) for ip in svc.eps]
    out += [f"add chain {KUBE} {service_chain(svc.name)}\n", render_service_rules(svc)]
    local = local_endpoints(svc)
    if svc.local and local:
        out += [f"add chain {KUBE} {local_chain(svc.name)}\n"]
        out += [render_pick_rules(svc, local_chain(svc.name), local)]
    if svc.external:
        out += [f"add chain {KUBE} {external_chain(svc.name)}\n", render_external_rules(svc)]
    if svc.ranges and svc.lb_ip:
        out += [f"add chain {KUBE} {firewall_chain(svc.name)}\n", render_firewall_rules(svc)]
    return "".join(out) + "".join(f"add element {KUBE} {e}\n" for e in calc_elements(svc))


def calc_elements(svc: BenchService) -> list[str]:
    """``<map> { <element> }`` of the Service's dispatch, firewall and no-endpoint entries."""
    out = [
        f"service-ips {{ {svc.vip} . tcp . {PORT} : goto {service_chain(svc.name)} }}",
        f"cluster-ips {{ {svc.vip} }}",
    ]
    to_external = f"goto {external_chain(svc.name)}"
    drop = svc.local and not local_endpoints(svc)  # Local policy, no local endpoint
    if svc.node_port:
        out.append(f"service-nodeports {{ tcp . {svc.node_port} : {to_external} }}")
        out += [f"no-endpoint-nodeports {{ tcp . {svc.node_port} : drop }}"] if drop else []
    if svc.lb_ip is not None:
        lb = f"{svc.lb_ip} . tcp . {PORT}"
        out.append(f"service-ips {{ {lb} : {to_external} }}")
        if svc.ranges:
            out.append(f"firewall-ips {{ {lb} : goto {firewall_chain(svc.name)} }}")
        out += [f"no-endpoint-services {{ {lb} : drop }}"] if drop else []
    return out


def render_full(plan: Plan) -> str:
    return render_skeleton() + "".join(render_service(svc) for svc in plan)


def calc_chain_count(plan: Plan) -> int:
    """The chains a full render makes: the static ones and per Service its service-,
    endpoint-, local-, external- and firewall- chains."""
    return STATIC_CHAINS + sum(
        1
        + len(svc.eps)
        + (svc.local and bool(local_endpoints(svc)))
        + svc.external
        + bool(svc.ranges and svc.lb_ip)
        for svc in plan
    )


def render_update(old: Plan, new: Plan) -> str:
    """kube-proxy's transaction for the Services whose endpoints changed between two plans."""
    return "".join(
        _render_changed(svc0, svc1)
        for svc0, svc1 in zip(old, new, strict=True)
        if svc0 is not svc1 and svc0 != svc1
    )


def _render_changed(old: BenchService, new: BenchService) -> str:
    """New endpoint chains, the choosing chains refilled, then the old endpoints' chains and
    affinity sets deleted (nothing names them any more). A Local-policy Service keeps a
    local endpoint in the bench's swap, so its ``local-`` chain stays."""
    gone = [ip for ip in old.eps if ip not in new.eps]
    out = [render_endpoint(new, ip) for ip in new.eps if ip not in old.eps]
    out += [f"flush chain {KUBE} {service_chain(new.name)}\n", render_service_rules(new)]
    local = local_endpoints(new)
    if new.local and local:
        out += [f"flush chain {KUBE} {local_chain(new.name)}\n"]
        out += [render_pick_rules(new, local_chain(new.name), local)]
    for ip in gone:
        chain = endpoint_chain(new.name, ip)
        out.append(f"flush chain {KUBE} {chain}\ndelete chain {KUBE} {chain}\n")
    out += [f"delete set {KUBE} {affinity_set(new.name, ip)}\n" for ip in gone if new.affinity]
    return "".join(out)

"""The Services `make bench-svc` loads, over one address plan, and pycni's side of them.

Both shapes serve the same Services (``calc_plan``): N Services of one TCP port (80 ->
8080) with ``ENDPOINTS`` backends each, off-cluster clients and hairpin traffic
masqueraded. By default a mix of the features a Service proxy must cover, per 100 Services
(slot = index % 100):

- 5 LoadBalancer (slots 0-4): a nodePort and one load balancer ingress IP each; 2 of them
  (slots 0, 2) with 2 ``loadBalancerSourceRanges``;
- 10 NodePort (slots 5-14);
- 5 externalTrafficPolicy Local among those (slots 0, 1: LoadBalancer; 5-7: NodePort), with
  2 of their 5 endpoints on the measured node and 3 elsewhere, so Local has local and
  non-local endpoints;
- 5 sessionAffinity ClientIP (slot 4: LoadBalancer, 8: NodePort, 15-17: ClusterIP), the
  default timeout;
- the other 80 ClusterIP, Cluster policy (``--mix clusterip``: all of them, as before;
  ``--mix mixed-2aff``: the same mix with affinity on slots 4 and 8 only, 2 per 100).

The one-Service update swaps endpoint 0 of the Service ``calc_update_index`` names: with the
mix a LoadBalancer with externalTrafficPolicy Local and source ranges (slot 0), whose
endpoint 0 is local (the spare that replaces it too).

- pycni: the real proxy pass (``services.proxy``) over the store records pycnid would hold
  (``build_records``), each Service selecting its 5 endpoints by label; ``build_model`` is
  the model the proxy makes of them, for the unit tests;
- kube-proxy: the shape of kube-proxy's nftables mode over the same Services
  (bench/svc_kube.py).

Address plan (ClusterIPs, Pods and node as kube-proxy's own unit tests use): ClusterIPs
172.30.0.0/16, Pods 10.0.0.0/8, node 192.168.0.2; load balancer IPs 198.18.0.0/15 and source
ranges from the documentation ranges (none holds the node), nodePorts from 30000 on.
"""

from __future__ import annotations

import ipaddress
from typing import NamedTuple

from services.proxy.model import NodeView, ProxyModel
from services.proxy.view import Records, calc_model
from services.record import EndpointRecord, ServicePort, ServiceRecord, ServiceSettings
from store.base import KV

ENDPOINTS = 5
NODES = 100
PORT, TARGET = 80, 8080
VIPS = ipaddress.IPv4Network("172.30.0.0/16")
PODS = ipaddress.IPv4Network("10.0.0.0/8")
SPARE = ipaddress.IPv4Network("10.255.0.0/16")  # the endpoint an update swaps in
LB_IPS = ipaddress.IPv4Network("198.18.0.0/15")
SOURCE_RANGES = ("198.51.100.0/24", "203.0.113.0/24")
NODE_PORT_BASE = 30000
NODE = NodeView("n1", (ipaddress.ip_address("192.168.0.2"),), (PODS,), (VIPS,))
LOCAL_IPS = [str(ip) for ip in NODE.node_ips]

# The mix, by slot (index % 100): see the module docstring.
SLOTS = 100
LOAD_BALANCER = range(0, 5)
NODE_PORT = range(5, 15)
EXTERNAL_SLOTS = 15  # LoadBalancer and NodePort: a nodePort each
EXTERNAL_LOCAL = frozenset({0, 1, 5, 6, 7})
WITH_SOURCE_RANGES = frozenset({0, 2})
CLIENT_IP_AFFINITY = frozenset({4, 8, 15, 16, 17})
LOCAL_ENDPOINTS = 2  # of a Local-policy Service's endpoints, on the measured node
MIXES = ("mixed", "mixed-2aff", "clusterip")
MIX_TAGS = {"mixed": "mixed", "mixed-2aff": "mixed (2% affinity)", "clusterip": "ClusterIP"}
MIX_LABELS = {
    "mixed": "mixed: per 100, 5 LoadBalancer, 10 NodePort, 5 ETP Local, 5 affinity",
    "mixed-2aff": "mixed: per 100, 5 LoadBalancer, 10 NodePort, 5 ETP Local, 2 affinity",
    "clusterip": "all ClusterIP, Cluster policy",
}
#: the affinity slots of each mix: ``mixed-2aff`` keeps those of slots 4 and 8 (the
#: LoadBalancer and the NodePort one), the others plain ClusterIP
AFFINITY_SLOTS = {"mixed": CLIENT_IP_AFFINITY, "mixed-2aff": frozenset({4, 8})}


class BenchService(NamedTuple):
    """One benched Service: its ClusterIP, endpoint addresses and features."""

    name: str
    vip: ipaddress.IPv4Address
    eps: tuple[ipaddress.IPv4Address, ...]
    kind: str = "ClusterIP"  # | NodePort | LoadBalancer
    node_port: int = 0
    lb_ip: ipaddress.IPv4Address | None = None
    ranges: tuple[str, ...] = ()
    local: bool = False  # externalTrafficPolicy Local
    affinity: bool = False  # sessionAffinity ClientIP

    @property
    def external(self) -> bool:
        return self.kind != "ClusterIP"


Plan = list[BenchService]


def calc_plan(services: int, mix: str = "mixed") -> Plan:
    """Every Service of the run; addresses and nodePorts unique in it."""
    if services >= VIPS.num_addresses - 2:
        raise ValueError(f"at most {VIPS.num_addresses - 2} Services fit {VIPS}")
    base = int(PODS.network_address) + 256
    plan = []
    for i in range(services):
        eps = tuple(ipaddress.IPv4Address(base + i * ENDPOINTS + j) for j in range(ENDPOINTS))
        svc = BenchService(f"svc{i}", VIPS[i + 1], eps)
        affinity = AFFINITY_SLOTS.get(mix)
        plan.append(_with_features(svc, i, affinity) if affinity is not None else svc)
    return plan


def _with_features(svc: BenchService, i: int, affinity: frozenset[int]) -> BenchService:
    slot, block = i % SLOTS, i // SLOTS
    if slot not in LOAD_BALANCER and slot not in NODE_PORT:
        return svc._replace(affinity=slot in affinity)
    balanced = slot in LOAD_BALANCER
    return svc._replace(
        kind="LoadBalancer" if balanced else "NodePort",
        node_port=NODE_PORT_BASE + block * EXTERNAL_SLOTS + slot,
        lb_ip=LB_IPS[1 + block * len(LOAD_BALANCER) + slot] if balanced else None,
        ranges=SOURCE_RANGES if slot in WITH_SOURCE_RANGES else (),
        local=slot in EXTERNAL_LOCAL,
        affinity=slot in affinity,
    )


def calc_update_index(services: int) -> int:
    """The Service the update changes: the first of slot 0 from the middle on (the middle
    one if there is none)."""
    middle = services // 2
    first = middle - middle % SLOTS
    return first if first < services else middle


def calc_swap(plan: Plan, round_: int) -> Plan:
    """The plan with endpoint 0 of the updated Service swapped for a spare address, or back."""
    if round_ % 2 == 0:
        return plan
    i = calc_update_index(len(plan))
    svc = plan[i]
    new = svc._replace(eps=(SPARE[1 + i % 60000], *svc.eps[1:]))
    return plan[:i] + [new] + plan[i + 1 :]


def calc_endpoint_nodes(svc: BenchService) -> tuple[str, ...]:
    """Where each endpoint runs; the measured node is ``n1``. Endpoints are spread over
    ``NODES`` nodes, one in ``NODES`` local (500 at 10k Services, already 4.5x kubelet's
    default max-pods), except under externalTrafficPolicy Local: its first
    ``LOCAL_ENDPOINTS`` are local, the rest on other nodes. Locality changes pycni's hairpin
    set, and the Local policy's backends in both shapes (the kube-proxy shape renders its
    hairpin rule in every endpoint chain, as kube-proxy does)."""
    if svc.local:
        return tuple(
            NODE.node if j < LOCAL_ENDPOINTS else f"n{2 + int(ip) % (NODES - 1)}"
            for j, ip in enumerate(svc.eps)
        )
    return tuple(f"n{int(ip) % NODES + 1}" for ip in svc.eps)


def calc_dispatch_count(plan: Plan) -> int:
    """The ``service-ips`` elements of either shape: a ClusterIP each, a load balancer IP
    each (every Local-policy Service has local endpoints)."""
    return len(plan) + sum(svc.lb_ip is not None for svc in plan)


# --- pycni ------------------------------------------------------------------------------------


def build_records(plan: Plan) -> Records:
    """The Services as store records, as pycnid's proxy holds them (each Service selects its
    own endpoints by label), with the node's pools and service CIDR."""
    records = Records()
    records.pools["bench"] = str(PODS)
    records.settings = ServiceSettings((str(VIPS),))
    for svc in plan:
        record = build_service_record(svc)
        records.apply(KV(record.key, record.to_bytes(), 0))
        for j, (ip, node) in enumerate(zip(svc.eps, calc_endpoint_nodes(svc), strict=True)):
            records.apply(_endpoint_kv(svc.name, j, ip, node))
    return records


def build_service_record(svc: BenchService) -> ServiceRecord:
    return ServiceRecord(
        "bench",
        svc.name,
        type=svc.kind,
        ports=(ServicePort("http", "TCP", PORT, TARGET, svc.node_port),),
        cluster_ips=(str(svc.vip),),
        selector={"svc": svc.name},
        session_affinity="ClientIP" if svc.affinity else "None",
        external_traffic_policy="Local" if svc.local else "Cluster",
        load_balancer_ips=(str(svc.lb_ip),) if svc.lb_ip else (),
        load_balancer_source_ranges=svc.ranges,
    )


def build_model(plan: Plan) -> ProxyModel:
    """The model pycnid's proxy makes of the plan's records on the measured node."""
    return calc_model(build_records(plan), NODE.node, 4, LOCAL_IPS)


def swap_records(records: Records, old: Plan, new: Plan) -> None:
    """Apply the endpoint records that differ between two plans (a watch event each)."""
    for svc0, svc1 in zip(old, new, strict=True):
        if svc0 is svc1:
            continue
        nodes = calc_endpoint_nodes(svc1)
        for j, (ip0, ip1) in enumerate(zip(svc0.eps, svc1.eps, strict=True)):
            if ip0 != ip1:
                records.apply(_endpoint_kv(svc1.name, j, ip1, nodes[j]))


def _endpoint_kv(name: str, j: int, ip: ipaddress.IPv4Address, node: str) -> KV:
    ep = EndpointRecord("bench", f"{name}-{j}", "eth0", (str(ip),), {"svc": name}, node)
    return KV(ep.key, ep.to_bytes(), 0)

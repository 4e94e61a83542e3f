"""Generated Service cases for the reference model (tests/fixtures/svc_reference.py) and their
store records: a node n1 (whose kernel is asked) and a node n2, Services of every type and
policy with endpoints on both, n1's proxy settings (masqueradeAll, detectLocalMode), packets
from a Pod, from the node and from off the cluster, each with the interface it reaches n1 on,
to every kind of entry and to addresses that are none.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from nodes.record import NodeRecord, node_key
from services.proxy.view import Records
from services.record import ServiceSettings, endpoint_key, service_key
from store.base import KV
from store.codec import encode
from store.keys import SERVICES_META, pool_key
from tests.fixtures.svc_reference import Cluster, Endpoint, Packet, Service


@dataclass(frozen=True)
class Plan:
    """One family's addresses: Pods of n1 and n2 (prefix + host number), the cluster and
    service CIDRs, n1's NodePort addresses and the bridge gateway (a pool address, never a
    NodePort one), externalIPs, load-balancer IPs, off-cluster clients."""

    pods: dict
    cluster: str
    services: str
    vip: str
    node_ips: tuple[str, str]
    gateway: str
    external: str
    lb: str
    client: str
    elsewhere: str


PLANS = {
    4: Plan(
        {"n1": "10.0.1.", "n2": "10.0.2."},
        "10.0.0.0/16",
        "10.96.0.0/16",
        "10.96.0.",
        ("192.168.0.2", "192.168.1.2"),
        "10.0.1.1",
        "203.0.113.",
        "198.51.100.",
        "172.16.0.",
        "192.0.2.77",
    ),
    6: Plan(
        {"n1": "fd00:0:1::", "n2": "fd00:0:2::"},
        "fd00::/32",
        "fd96::/112",
        "fd96::",
        ("fd01::2", "fd01:1::2"),
        "fd00:0:1::1",
        "2001:db8:1::",
        "2001:db8:2::",
        "2001:db8:9::",
        "2001:db8:ff::77",
    ),
}
PODS = (2, 3, 4, 5, 7)  # Pod hosts: 2-5 may be endpoints, 7 is a client only
CLIENTS = 6  # off-cluster clients: <client>1 .. <client>6; source ranges cover the first 3
TYPES = ("ClusterIP", "NodePort", "LoadBalancer")


@st.composite
def endpoints(draw, plan: Plan) -> tuple[Endpoint, ...]:
    picked = draw(
        st.lists(
            st.tuples(st.sampled_from(("n1", "n2")), st.integers(2, 5)),
            max_size=4,
            unique=True,
        )
    )
    conditions = st.sampled_from(
        [(True, True, False), (False, True, True), (False, False, True), (False, False, False)]
    )
    return tuple(
        Endpoint(f"{plan.pods[node]}{host}", node, *draw(conditions)) for node, host in picked
    )


@st.composite
def services(draw, family: int, index: int, protocols: tuple[str, ...]) -> Service:
    plan, n = PLANS[family], index + 10
    kind = draw(st.sampled_from(TYPES))
    lb = kind == "LoadBalancer"
    ranges = (f"{plan.client}0/126" if family == 6 else f"{plan.client}0/30", plan.cluster)
    return Service(
        f"s{index}",
        kind,
        (f"{plan.vip}{n}",),
        draw(st.sampled_from((80, 443))),
        protocol=draw(st.sampled_from(protocols)),
        node_port=30000 + index if kind != "ClusterIP" else None,
        external_ips=(f"{plan.external}{n}",) if draw(st.booleans()) else (),
        lb_ips=(f"{plan.lb}{n}",) if lb else (),
        lb_source_ranges=ranges if lb and draw(st.booleans()) else (),
        etp_local=draw(st.booleans()),
        itp_local=draw(st.booleans()),
        affinity=draw(st.booleans()),
        endpoints=draw(endpoints(plan)),
    )


@st.composite
def clusters(draw, family: int, protocols: tuple[str, ...] = ("tcp", "udp")) -> Cluster:
    plan = PLANS[family]
    count = draw(st.integers(1, 3))
    return Cluster(
        "n1",
        plan.node_ips,
        (plan.cluster,),
        (plan.services,),
        tuple(draw(services(family, i, protocols)) for i in range(count)),
        masquerade_all=draw(st.integers(0, 4)) == 0,
        local_bridge=BRIDGE if draw(st.integers(0, 2)) == 0 else None,
    )


BRIDGE = "p"  # under BridgeInterface: n1's Pod links (p<host>), never its uplinks a0, a1
IIF = {"n2": "a0", "outside": "a1", "node": ""}  # where n1 receives a packet from


def render_proxy_section(cluster: Cluster) -> dict:
    """n1's ``services`` config section for the cluster's proxy settings."""
    section: dict = {"proxy": True, "masqueradeAll": cluster.masquerade_all}
    if cluster.local_bridge is not None:
        section["detectLocalMode"] = "BridgeInterface"
        section["detectLocal"] = {"bridgeInterface": cluster.local_bridge}
    return section


@st.composite
def packets(draw, cluster: Cluster, family: int, other_protocol: bool = True) -> Packet:
    plan = PLANS[family]
    kind = draw(st.sampled_from(("pod", "node", "outside")))
    iif = IIF.get(kind, "")
    if kind == "pod":
        node, host = draw(st.sampled_from(("n1", "n2"))), draw(st.sampled_from(PODS))
        src, iif = plan.pods[node] + str(host), f"{BRIDGE}{host}" if node == "n1" else IIF[node]
    elif kind == "node":
        src = draw(st.sampled_from(plan.node_ips))
    else:
        src = f"{plan.client}{draw(st.integers(1, CLIENTS))}"
    svc = draw(st.sampled_from(cluster.services))
    targets = [(ip, svc.port) for ip in (*svc.cluster_ips, *svc.external_ips, *svc.lb_ips)]
    if svc.node_port is not None:
        targets += [(ip, svc.node_port) for ip in plan.node_ips]
    targets += [(svc.cluster_ips[0], 8), (f"{plan.vip}200", 80), (plan.elsewhere, 80)]
    dst, port = draw(st.sampled_from(targets))
    other = "udp" if svc.protocol == "tcp" else "tcp"
    protocol = draw(st.sampled_from((svc.protocol,) * 5 + (other,) * other_protocol))
    return Packet(src, dst, port, protocol, from_node=kind == "node", iif=iif)


def calc_records(cluster: Cluster) -> list[KV]:
    """The store records of ``cluster`` as `pycni svc` and pycni-svc write them."""
    kvs = [
        KV(SERVICES_META, ServiceSettings(cluster.service_cidrs).to_bytes(), 1),
        KV(node_key(cluster.node), NodeRecord(cluster.node, cluster.node_ips[0]).to_bytes(), 1),
    ]
    kvs += [
        KV(pool_key(f"p{i}"), encode({"cidr": c}), 1) for i, c in enumerate(cluster.cluster_cidrs)
    ]
    for svc in cluster.services:
        kvs.append(KV(service_key("default", svc.name), encode(render_service(svc)), 1))
        for i, e in enumerate(svc.endpoints):
            pod = f"{svc.name}-{i}"
            kvs.append(
                KV(endpoint_key("default", pod, "eth0"), encode(render_endpoint(svc, pod, e)), 1)
            )
    return kvs


def render_service(svc: Service) -> dict:
    port = {"name": "p", "protocol": svc.protocol.upper(), "port": svc.port}
    port |= {"targetPort": svc.target_port, "nodePort": svc.node_port or 0}
    doc = {
        "namespace": "default",
        "name": svc.name,
        "type": svc.type,
        "ports": [port],
        "clusterIPs": list(svc.cluster_ips),
        "externalIPs": list(svc.external_ips),
        "selector": {"svc": svc.name},
        "sessionAffinity": "ClientIP" if svc.affinity else "None",
        "timeoutSeconds": 10800,
        "externalTrafficPolicy": "Local" if svc.etp_local else "Cluster",
        "internalTrafficPolicy": "Local" if svc.itp_local else "Cluster",
    }
    if svc.lb_ips:
        doc["loadBalancerIPs"] = list(svc.lb_ips)
    if svc.lb_source_ranges:
        doc["loadBalancerSourceRanges"] = list(svc.lb_source_ranges)
    return doc


def render_endpoint(svc: Service, pod: str, e: Endpoint) -> dict:
    return {
        "namespace": "default",
        "pod": pod,
        "ifname": "eth0",
        "ips": [e.ip],
        "labels": {"svc": svc.name},
        "node": e.node,
        "ready": e.ready,
        "serving": e.serving,
        "terminating": e.terminating,
    }


def calc_store_records(cluster: Cluster) -> Records:
    records = Records()
    for kv in calc_records(cluster):
        records.apply(kv)
    return records

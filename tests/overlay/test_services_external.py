"""External entries (NodePort, externalIP) of externalTrafficPolicy Local Services on a 2-node
dual-stack vxlan cluster with the proxy in every pycnid: the policy is for external traffic
only. Two backend Pods, e0 on node1 and e1 on node2, answer with their address and the source
they saw; a client Pod sits on node1. A Pod, or node1 itself, reaching node1's NodePort or an
externalIP reaches both backends (as through a ClusterIP; the node's own traffic masqueraded),
and still reaches node2's backend when node1 has none. `pycni svc trace` is asked each
question and must say the same; conntrack in node1's namespace shows where the flows went."""

from __future__ import annotations

import subprocess

import pytest

from services.record import EndpointRecord
from tests.fixtures.bridge import ip_of
from tests.fixtures.cluster import b64
from tests.fixtures.echo import PEER_SERVER
from tests.fixtures.waiting import wait_for

from .pods import python_in
from .svc_policy_helpers import (
    backends_of,
    connect,
    connect_each,
    flows,
    flush_conntrack,
    node_addresses,
    route_service_cidrs,
    svc,
    trace,
)
from .test_services_policy import CIDRS, address, dual_stack_conf, node_port

pytestmark = pytest.mark.etcd
EXTERNAL, EXTERNAL6 = "203.0.113.90", "2001:db8:90::1"
LB_IP, LB_IP6 = "203.0.113.91", "2001:db8:91::1"
OUTSIDE = 101  # the off-cluster client's underlay octet


def endpoint(pod, name: str) -> EndpointRecord:
    return EndpointRecord(
        "ns", name, "eth0", (pod.ip, ip_of(pod.result, 1)), {"app": "etp"}, pod.node.name
    )


@pytest.fixture(scope="module")
def world(module_overlay):
    """The cluster, backends e0 (node1) and e1 (node2), a client Pod on node1, and one
    NodePort Service with both externalIPs under externalTrafficPolicy Local."""
    cluster = module_overlay("vxlan", nodes=2, daemon={"services": {"proxy": True}})
    cluster.add_pool("pods6", "fd31::/112", 122)
    cluster.wait_vteps(lambda overlay: len(overlay["vteps"]) == 2)
    n1, n2 = cluster.nodes
    backends = [cluster.add_pod(n, dual_stack_conf()) for n in (n1, n2)]
    client = cluster.add_pod(n1, dual_stack_conf())
    outside = cluster.cluster.underlay.add_host("ext", OUTSIDE)
    servers = [subprocess.Popen(python_in(p.ns, PEER_SERVER)) for p in backends]
    for i, pod in enumerate(backends):
        ep = endpoint(pod, f"e{i}")
        cluster.cluster.etcd.put(ep.key, ep.to_bytes())
    for node in cluster.nodes:
        route_service_cidrs(node.host.ns, CIDRS)
    svc(cluster, "config", "set", *[a for c in CIDRS for a in ("--cidr", c)])
    local = svc(
        cluster,
        "create",
        "ns/etp",
        "--type",
        "NodePort",
        "--port",
        "80/TCP:8080",
        "--selector",
        "app=etp",
        "--external-ip",
        EXTERNAL,
        "--external-ip",
        EXTERNAL6,
        "--external-traffic-policy",
        "Local",
    )["service"]
    yield cluster, backends, client, node_port(local), outside
    for server in servers:
        server.kill()
        server.wait()


def wait_answered(ns, ip: str, port: int, want: set[str]) -> None:
    """Until 20 connects are answered by exactly ``want`` (the proxy followed the store)."""
    wait_for(
        f"{ip}:{port} answered by {want}",
        lambda: backends_of(connect(ns, ip, port, 20, 2.0)) == want,
        20,
        0.2,
    )


def test_a_pod_reaches_every_backend_through_a_local_nodeport_and_external_ip(world):
    cluster, backends, client, port, _ = world
    n1 = cluster.nodes[0]
    both, both6 = {p.ip for p in backends}, {ip_of(p.result, 1) for p in backends}
    target = address(cluster, n1)
    for ip, dst, want, me in (
        (target, target, both, client.ip),
        (EXTERNAL, EXTERNAL, both, client.ip),
        (EXTERNAL6, f"[{EXTERNAL6}]", both6, ip_of(client.result, 1)),
    ):
        wait_answered(client.ns, ip, port if ip == target else 80, want)
        flush_conntrack(n1.host.ns)
        answers = [a.split(",") for a in connect(client.ns, ip, port if ip == target else 80, 20)]
        assert {b for b, _ in answers} == want, answers
        assert {peer for _, peer in answers} == {me}, answers  # a Pod's source is kept
        answer = trace(cluster, me, f"{dst}:{port if ip == target else 80}/tcp", n1.name)
        assert answer["verdict"] == "dnat", answer
        assert answer["entry"] == ("NodePort" if ip == target else "externalIP")
        assert {c["ip"] for c in answer["choices"]} == want
        assert not any(c["masquerade"] for c in answer["choices"]), answer
        assert "does not apply" in answer["reason"]
        tracked = flows(n1.host.ns, 6 if ":" in ip else 4, ip, port if ip == target else 80)
        assert {f.reply_src for f in tracked} == want
        assert {f.reply_dst for f in tracked} == {me}


def test_a_pod_reaches_the_other_nodes_backend_when_its_node_has_none(world):
    cluster, backends, client, port, _ = world
    n1 = cluster.nodes[0]
    gone = endpoint(backends[0], "e0")
    cluster.cluster.etcd.call("/v3/kv/deleterange", {"key": b64(gone.key)})
    try:
        remote, remote6 = backends[1].ip, ip_of(backends[1].result, 1)
        target = address(cluster, n1)
        for ip, p, want in (
            (target, port, remote),
            (EXTERNAL, 80, remote),
            (EXTERNAL6, 80, remote6),
        ):
            wait_answered(client.ns, ip, p, {want})
            assert backends_of(connect(client.ns, ip, p, 20)) == {want}
        answer = trace(cluster, client.ip, f"{target}:{port}/tcp", n1.name)
        assert (answer["verdict"], [c["ip"] for c in answer["choices"]]) == ("dnat", [remote])
        outside = trace(cluster, "198.51.100.7", f"{target}:{port}/tcp", n1.name)
        assert outside["verdict"] == "drop"  # the policy still holds for an outside client
    finally:
        cluster.cluster.etcd.put(gone.key, gone.to_bytes())
    wait_answered(client.ns, address(cluster, n1), port, {p.ip for p in backends})


def test_the_node_itself_reaches_every_backend_masqueraded(world):
    cluster, backends, _, port, _ = world
    n1 = cluster.nodes[0]
    host, both, target = n1.host.ns, {p.ip for p in backends}, address(cluster, n1)
    host.run(["ip", "route", "replace", f"{EXTERNAL}/32", "dev", "eth0"])
    for ip, p in ((target, port), (EXTERNAL, 80)):
        wait_answered(host, ip, p, both)
        flush_conntrack(host)
        answers = [a.split(",") for a in connect(host, ip, p, 20)]
        assert {b for b, _ in answers} == both, answers
        assert {peer for _, peer in answers} <= node_addresses(host), answers
        answer = trace(cluster, target, f"{ip}:{p}/tcp", n1.name)
        assert {c["ip"] for c in answer["choices"]} == both, answer
        assert all(c["masquerade"] for c in answer["choices"]), answer
        assert {f.reply_src for f in flows(host, 4, ip, p)} == both


def test_a_load_balancer_ip_is_local_from_outside_and_every_backend_from_a_pod(world):
    """type LoadBalancer: nodePorts allocated, its ingress IPs DNATed like externalIPs; under
    externalTrafficPolicy Local an outside client routed to node2 reaches node2's backend only,
    its address kept, while a Pod on node1 reaches both (IPv4 and IPv6)."""
    cluster, backends, client, _, outside = world
    n1, n2 = cluster.nodes
    made = svc(
        cluster,
        "create",
        "ns/lb",
        "--type",
        "LoadBalancer",
        "--port",
        "80/TCP:8080",
        "--selector",
        "app=etp",
        "--load-balancer-ip",
        LB_IP,
        "--load-balancer-ip",
        LB_IP6,
        "--external-traffic-policy",
        "Local",
    )["service"]
    assert made["type"] == "LoadBalancer" and node_port(made)
    assert made["loadBalancerIPs"] == [LB_IP, LB_IP6]
    outside.ns.run(["ip", "route", "replace", f"{LB_IP}/32", "via", address(cluster, n2)])
    wait_answered(outside.ns, LB_IP, 80, {backends[1].ip})
    flush_conntrack(n2.host.ns)
    answers = [a.split(",") for a in connect(outside.ns, LB_IP, 80, 20)]
    assert answers == [[backends[1].ip, outside.address]] * 20  # Local: client IP kept
    answer = trace(cluster, outside.address, f"{LB_IP}:80/tcp", n2.name)
    assert (answer["entry"], answer["verdict"]) == ("LoadBalancerIP", "dnat")
    assert [(c["ip"], c["masquerade"]) for c in answer["choices"]] == [(backends[1].ip, False)]
    assert {f.reply_dst for f in flows(n2.host.ns, 4, LB_IP, 80)} == {outside.address}
    both6 = {ip_of(p.result, 1) for p in backends}
    for ip, dst, want in (
        (LB_IP, LB_IP, {p.ip for p in backends}),
        (LB_IP6, f"[{LB_IP6}]", both6),
    ):
        wait_answered(client.ns, ip, 80, want)
        answer = trace(
            cluster,
            client.ip if ip == LB_IP else ip_of(client.result, 1),
            f"{dst}:80/tcp",
            n1.name,
        )
        assert (answer["entry"], answer["verdict"]) == ("LoadBalancerIP", "dnat")
        assert {c["ip"] for c in answer["choices"]} == want


FENCED, FENCED6 = "203.0.113.92", "2001:db8:92::1"


def fence_holds(node, family: int, text: str) -> bool:
    """Whether the node's proxy holds a firewall-allow interval ``text``."""
    table = "ip6" if family == 6 else "ip"
    out = node.host.ns.run(
        ["nft", "list", "set", table, "pycni-svc", "firewall-allow"], check=False
    ).stdout
    return text in out


def test_load_balancer_source_ranges_drop_every_client_outside_them(world):
    """The firewall sees the pre-DNAT destination and every source, as kube-proxy's: an
    outside client, a Pod and the node itself each reach the load balancer IPs only from
    inside the ranges (Pods too: a range must hold the cluster CIDR to let them in)."""
    cluster, backends, client, _, outside = world
    n1, n2 = cluster.nodes
    svc(
        cluster,
        "create",
        "ns/fenced",
        "--type",
        "LoadBalancer",
        "--port",
        "80/TCP:8080",
        "--selector",
        "app=etp",
        "--load-balancer-ip",
        FENCED,
        "--load-balancer-ip",
        FENCED6,
        "--load-balancer-source-range",
        "198.51.100.0/24",
        "--load-balancer-source-range",
        "2001:db8:ffff::/48",
    )
    outside.ns.run(["ip", "route", "replace", f"{FENCED}/32", "via", address(cluster, n2)])
    n1.host.ns.run(["ip", "route", "replace", f"{FENCED}/32", "dev", "eth0"])
    pod6 = ip_of(client.result, 1)
    for node in (n1, n2):
        wait_for("the fence", lambda n=node: fence_holds(n, 4, "198.51.100.0/24"), 20, 0.2)
    wait_for("node1's v6 fence", lambda: fence_holds(n1, 6, "2001:db8:ffff::/48"), 20, 0.2)
    fenced = (
        (outside.ns, FENCED),
        (client.ns, FENCED),
        (client.ns, FENCED6),
        (n1.host.ns, FENCED),
    )
    answers = connect_each([(ns, ip, 80, 2, 1.0) for ns, ip in fenced])
    for (ns, ip), got in zip(fenced, answers, strict=True):
        assert got == ["TimeoutError"] * 2, (ns, ip)
    for src, dst, node in (
        (outside.address, f"{FENCED}:80/tcp", n2),
        (client.ip, f"{FENCED}:80/tcp", n1),
        (pod6, f"[{FENCED6}]:80/tcp", n1),
        (address(cluster, n1), f"{FENCED}:80/tcp", n1),
    ):
        answer = trace(cluster, src, dst, node.name)
        assert (answer["entry"], answer["verdict"]) == ("LoadBalancerIP", "drop"), answer
        assert "loadBalancerSourceRanges" in answer["reason"]
    underlay = outside.address.rsplit(".", 1)[0] + ".0/24"  # the outside client and the nodes
    svc(
        cluster,
        "set",
        "ns/fenced",
        "--load-balancer-source-range",
        underlay,
        "--load-balancer-source-range",
        "fd31::/112",  # the Pods' IPv6 pool
    )
    both, both6 = {p.ip for p in backends}, {ip_of(p.result, 1) for p in backends}
    wait_answered(outside.ns, FENCED, 80, both)  # Cluster policy: every backend
    wait_answered(client.ns, FENCED6, 80, both6)
    wait_answered(n1.host.ns, FENCED, 80, both)  # the node is in a range
    assert connect(client.ns, FENCED, 80, 2, 1.0) == ["TimeoutError"] * 2  # the Pod is not
    for src, dst, node, verdict in (
        (outside.address, f"{FENCED}:80/tcp", n2, "dnat"),
        (pod6, f"[{FENCED6}]:80/tcp", n1, "dnat"),
        (address(cluster, n1), f"{FENCED}:80/tcp", n1, "dnat"),
        (client.ip, f"{FENCED}:80/tcp", n1, "drop"),
    ):
        assert trace(cluster, src, dst, node.name)["verdict"] == verdict, (src, dst)
    flush_conntrack(n2.host.ns)
    connect(outside.ns, FENCED, 80, 5)
    assert {f.reply_src for f in flows(n2.host.ns, 4, FENCED, 80)} <= both


def test_the_node_itself_reaches_every_ipv6_backend_of_a_local_external_ip(world):
    """IPv6 node-originated: node1 with a global IPv6 address outside the cluster CIDRs (the
    underlay here has none) connects to the Local externalIP: both nodes' backends answer,
    the source masqueraded (never the node's own address, which node2 could not route)."""
    cluster, backends, _, _, _ = world
    host = cluster.nodes[0].host.ns
    host.run(["ip", "-6", "addr", "replace", "fd99::11/64", "dev", "eth0", "nodad"])
    host.run(
        ["ip", "-6", "route", "replace", f"{EXTERNAL6}/128", "dev", "eth0", "src", "fd99::11"]
    )
    both6 = {ip_of(p.result, 1) for p in backends}
    wait_answered(host, EXTERNAL6, 80, both6)
    answers = [a.split(",") for a in connect(host, EXTERNAL6, 80, 20)]
    assert {b for b, _ in answers} == both6, answers
    assert "fd99::11" not in {peer for _, peer in answers}, answers  # masqueraded

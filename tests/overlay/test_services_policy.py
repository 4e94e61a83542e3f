"""Traffic policies, NodePort from outside the cluster and IPv6 Services on a 2-node dual-stack
vxlan cluster with the proxy in every pycnid. Three backend Pods (one on node1, two on
node2; endpoints written as records, as pycni-svc will) answer with their address and the
source they saw; a client outside the cluster CIDRs sits on the underlay bridge (not a node, not
a Pod). Each test asks `pycni svc trace` the same question and checks its answer (entry,
verdict, masquerade, local-only) against conntrack in the node's namespace. Every wait is for
the proxy to follow a store change (wait_for), never a timed assertion."""

from __future__ import annotations

import subprocess

import pytest

from services.record import EndpointRecord
from tests.fixtures.bridge import ip_of
from tests.fixtures.echo import PEER_SERVER
from tests.fixtures.waiting import wait_for

from .pods import pod_conf, python_in
from .svc_policy_helpers import (
    backends_of,
    connect,
    connect_each,
    flows,
    flush_conntrack,
    has_element,
    node_addresses,
    route_service_cidrs,
    svc,
    trace,
)

pytestmark = pytest.mark.etcd
CIDRS = ("10.96.0.0/24", "fd00:96::/112")
OUTSIDE = 100  # the off-cluster client's underlay octet: 172.31.250.100
SHORT = 1.0  # a dropped SYN's connect timeout (a refusal comes back long before)


def dual_stack_conf() -> dict:
    conf = pod_conf()
    conf["ipam"] = {
        **conf["ipam"],
        "pools": ["pods", "pods6"],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
    }
    return conf


@pytest.fixture(scope="module")
def world(module_overlay):
    """The cluster, backends b0 (node1), b1 and b2 (node2) labelled app=pol (b0 also where=one,
    b1 and b2 where=two), a client Pod on node1 and the off-cluster client."""
    cluster = module_overlay("vxlan", nodes=2, daemon={"services": {"proxy": True}})
    cluster.add_pool("pods6", "fd31::/112", 122)
    cluster.wait_vteps(lambda overlay: len(overlay["vteps"]) == 2)
    n1, n2 = cluster.nodes
    backends = [cluster.add_pod(n, dual_stack_conf()) for n in (n1, n2, n2)]
    client = cluster.add_pod(n1, dual_stack_conf())
    outside = cluster.cluster.underlay.add_host("ext", OUTSIDE)
    servers = [subprocess.Popen(python_in(p.ns, PEER_SERVER)) for p in backends]
    for i, pod in enumerate(backends):
        labels = {"app": "pol", "where": "one" if pod.node is n1 else "two"}
        ep = EndpointRecord(
            "ns", f"b{i}", "eth0", (pod.ip, ip_of(pod.result, 1)), labels, pod.node.name
        )
        cluster.cluster.etcd.put(ep.key, ep.to_bytes())
    for node in cluster.nodes:
        route_service_cidrs(node.host.ns, CIDRS)
    svc(
        cluster,
        "config",
        "set",
        *[a for c in CIDRS for a in ("--cidr", c)],
        "--node-port-range",
        "30000-30100",
    )
    yield cluster, backends, client, outside
    for server in servers:
        server.kill()
        server.wait()


def address(cluster, node) -> str:
    return cluster.records()[node.name]["address"]


def node_port(service: dict) -> int:
    return service["ports"][0]["nodePort"]


def wait_backends(ns, ip: str, port: int, want: set[str], timeout: float = 2.0) -> None:
    """Until 10 connects are answered by exactly ``want`` (the proxy followed the change)."""
    wait_for(
        f"{ip}:{port} answered by {want}",
        lambda: backends_of(connect(ns, ip, port, 10, timeout)) == want,
        20,
        0.2,
    )


def test_a_nodeport_from_outside_reaches_both_nodes_masqueraded(world):
    cluster, backends, _, outside = world
    n1, n2 = cluster.nodes
    web = svc(
        cluster,
        "create",
        "ns/np",
        "--type",
        "NodePort",
        "--port",
        "80/TCP:8080",
        "--selector",
        "app=pol",
    )["service"]
    target, port = address(cluster, n2), node_port(web)
    wait_backends(outside.ns, target, port, {p.ip for p in backends})
    flush_conntrack(n2.host.ns)
    answers = [a.split(",") for a in connect(outside.ns, target, port, 60)]
    assert {me for me, _ in answers} == {p.ip for p in backends}, answers
    assert all(peer != outside.address for _, peer in answers), answers  # Cluster: masqueraded
    remote = {peer for me, peer in answers if me == backends[0].ip}
    assert remote and remote <= node_addresses(n2.host.ns), remote  # one node2 holds (its
    # overlay-side gateway: masquerade takes the out device's address, not the underlay's)
    answer = trace(cluster, outside.address, f"{target}:{port}/tcp", n2.name)
    assert (answer["entry"], answer["verdict"]) == ("NodePort", "dnat")
    assert all(c["masquerade"] for c in answer["choices"]), answer
    tracked = flows(n2.host.ns, 4, target, port)
    assert {f.reply_src for f in tracked} == {c["ip"] for c in answer["choices"]}
    assert outside.address not in {f.reply_dst for f in tracked}, tracked  # conntrack: SNATed


def test_external_policy_local_keeps_the_client_ip_and_only_local_backends(world):
    cluster, backends, _, outside = world
    n2 = cluster.nodes[1]
    web = svc(
        cluster,
        "create",
        "ns/local",
        "--type",
        "NodePort",
        "--port",
        "80/TCP:8080",
        "--selector",
        "app=pol",
        "--external-traffic-policy",
        "Local",
    )["service"]
    target, port = address(cluster, n2), node_port(web)
    local = {p.ip for p in backends if p.node is n2}
    wait_backends(outside.ns, target, port, local)
    flush_conntrack(n2.host.ns)
    answers = [a.split(",") for a in connect(outside.ns, target, port, 30)]
    assert {me for me, _ in answers} == local
    assert {peer for _, peer in answers} == {outside.address}  # the client's real IP
    answer = trace(cluster, outside.address, f"{target}:{port}/tcp", n2.name)
    assert (answer["entry"], answer["verdict"]) == ("NodePort", "dnat")
    assert {c["ip"] for c in answer["choices"]} == local
    assert not any(c["masquerade"] for c in answer["choices"]), answer
    tracked = flows(n2.host.ns, 4, target, port)
    assert {f.reply_src for f in tracked} == local
    assert {f.reply_dst for f in tracked} == {outside.address}  # conntrack: not SNATed


def test_external_policy_local_drops_a_nodeport_without_local_backend(world):
    cluster, backends, _, outside = world
    n1, n2 = cluster.nodes
    web = svc(
        cluster,
        "create",
        "ns/lonely",
        "--type",
        "NodePort",
        "--port",
        "80/TCP:8080",
        "--selector",
        "where=one",
        "--external-traffic-policy",
        "Local",
    )["service"]
    port = node_port(web)
    wait_backends(outside.ns, address(cluster, n1), port, {backends[0].ip})  # served on node1
    target = address(cluster, n2)
    wait_for("node2's proxy holding the Local NodePort", lambda: port_dropped(n2, port), 20, 0.2)
    flush_conntrack(n2.host.ns)
    dropped = connect_each([(outside.ns, target, port, 1, SHORT)] * 3)  # at once: one timeout
    assert dropped == [["TimeoutError"]] * 3  # no RST, no ICMP
    answer = trace(cluster, outside.address, f"{target}:{port}/tcp", n2.name)
    assert (answer["entry"], answer["verdict"]) == ("NodePort", "drop")
    assert answer["reason"] == "externalTrafficPolicy Local and no endpoint on this node"
    assert flows(n2.host.ns, 4, target, port) == []  # conntrack: dropped before confirmation


def port_dropped(node, port: int) -> bool:
    out = node.host.ns.run(
        ["nft", "list", "map", "ip", "pycni-svc", "no-endpoint-nodeports"], check=False
    ).stdout
    return f"tcp . {port} : drop" in out


def test_internal_policy_local_reaches_only_the_clients_node(world):
    cluster, backends, client, _ = world
    n1 = cluster.nodes[0]
    vip = svc(
        cluster,
        "create",
        "ns/inner",
        "--port",
        "80/TCP:8080",
        "--selector",
        "app=pol",
        "--internal-traffic-policy",
        "Local",
    )["service"]["clusterIPs"][0]
    wait_backends(client.ns, vip, 80, {backends[0].ip})
    flush_conntrack(n1.host.ns)
    answers = [a.split(",") for a in connect(client.ns, vip, 80, 20)]
    assert answers == [[backends[0].ip, client.ip]] * 20  # only node1's, the Pod's own IP
    answer = trace(cluster, client.ip, f"{vip}:80/tcp", n1.name)
    assert (answer["entry"], answer["verdict"]) == ("ClusterIP", "dnat")
    assert [(c["ip"], c["masquerade"]) for c in answer["choices"]] == [(backends[0].ip, False)]
    tracked = flows(n1.host.ns, 4, vip, 80)
    assert {(f.reply_src, f.reply_dst) for f in tracked} == {(backends[0].ip, client.ip)}


def test_internal_policy_local_drops_without_a_backend_on_the_clients_node(world):
    cluster, _, client, _ = world
    n1 = cluster.nodes[0]
    vip = svc(
        cluster,
        "create",
        "ns/far",
        "--port",
        "80/TCP:8080",
        "--selector",
        "where=two",
        "--internal-traffic-policy",
        "Local",
    )["service"]["clusterIPs"][0]
    wait_for(
        "node1's proxy holding the Local VIP",
        lambda: has_element(n1.host.ns, 4, "no-endpoints", vip),
        20,
        0.2,
    )
    flush_conntrack(n1.host.ns)
    assert connect_each([(client.ns, vip, 80, 1, SHORT)] * 3) == [["TimeoutError"]] * 3
    answer = trace(cluster, client.ip, f"{vip}:80/tcp", n1.name)
    assert (answer["entry"], answer["verdict"]) == ("ClusterIP", "drop")
    assert answer["reason"] == "internalTrafficPolicy Local and no endpoint on this node"
    assert flows(n1.host.ns, 4, vip, 80) == []


def test_an_ipv6_service_reaches_ipv6_backends_across_nodes(world):
    cluster, backends, client, _ = world
    n1 = cluster.nodes[0]
    ips = svc(cluster, "create", "ns/six", "--port", "80/TCP:8080", "--selector", "app=pol")[
        "service"
    ]["clusterIPs"]
    vip, mine, six = (
        [ip for ip in ips if ":" in ip][0],
        ip_of(client.result, 1),
        {ip_of(p.result, 1) for p in backends},
    )
    wait_backends(client.ns, vip, 80, six)
    flush_conntrack(n1.host.ns)
    answers = [a.split(",") for a in connect(client.ns, vip, 80, 60)]
    assert {me for me, _ in answers} == six and {peer for _, peer in answers} == {mine}
    answer = trace(cluster, mine, f"[{vip}]:80/tcp", n1.name)
    assert (answer["entry"], answer["verdict"]) == ("ClusterIP", "dnat")
    assert not any(c["masquerade"] for c in answer["choices"])
    tracked = flows(n1.host.ns, 6, vip, 80)
    assert {f.reply_src for f in tracked} == {c["ip"] for c in answer["choices"]} == six
    assert {f.reply_dst for f in tracked} == {mine}


def empty_ipv6_service(cluster, name: str) -> str:
    """A Service selecting no Pod, its IPv6 VIP once node1's proxy rejects it (before that
    sync the VIP is an unallocated service address: dropped)."""
    ips = svc(
        cluster, "create", f"ns/{name}", "--port", "80/TCP:8080", "--selector", "app=nobody"
    )["service"]["clusterIPs"]
    vip = [ip for ip in ips if ":" in ip][0]
    wait_for(
        "node1's proxy rejecting the empty IPv6 VIP",
        lambda: has_element(cluster.nodes[0].host.ns, 6, "no-endpoints", vip),
        20,
        0.2,
    )
    return vip


def test_an_empty_ipv6_service_is_refused(world):
    cluster, _, client, _ = world
    n1 = cluster.nodes[0]
    vip = empty_ipv6_service(cluster, "six-empty")
    flush_conntrack(n1.host.ns)
    assert connect(client.ns, vip, 80, 3, 3.0) == ["ConnectionRefusedError"] * 3
    answer = trace(cluster, ip_of(client.result, 1), f"[{vip}]:80/tcp", n1.name)
    assert (answer["entry"], answer["verdict"], answer["reason"]) == (
        "ClusterIP",
        "reject",
        "no endpoints",
    )
    assert flows(n1.host.ns, 6, vip, 80) == []  # conntrack: refused before confirmation


def test_an_empty_ipv6_service_is_refused_at_once(world):
    cluster, _, client, _ = world
    vip = empty_ipv6_service(cluster, "six-now")
    assert connect(client.ns, vip, 80, 3, 0.5) == ["ConnectionRefusedError"] * 3


def test_an_external_ip_from_outside_reaches_the_backends_masqueraded(world):
    """An externalIP routed to node2 by the off-cluster client: DNATed to every backend (both
    nodes), masqueraded under Cluster policy; trace names the externalIP entry."""
    cluster, backends, _, outside = world
    n2 = cluster.nodes[1]
    external = "203.0.113.80"
    svc(
        cluster,
        "create",
        "ns/ext",
        "--port",
        "80/TCP:8080",
        "--selector",
        "app=pol",
        "--external-ip",
        external,
    )
    outside.ns.run(["ip", "route", "replace", f"{external}/32", "via", address(cluster, n2)])
    wait_backends(outside.ns, external, 80, {p.ip for p in backends})
    answers = [a.split(",") for a in connect(outside.ns, external, 80, 30)]
    assert {me for me, _ in answers} == {p.ip for p in backends}, answers
    assert all(peer != outside.address for _, peer in answers), answers
    answer = trace(cluster, outside.address, f"{external}:80/tcp", n2.name)
    assert (answer["entry"], answer["verdict"]) == ("externalIP", "dnat")
    assert all(c["masquerade"] for c in answer["choices"]), answer

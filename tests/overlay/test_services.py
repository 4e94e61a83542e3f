"""The Service proxy in pycnid on a 2-node vxlan cluster (``services.proxy`` on every node):
a Service made with `pycni svc`, its three backend Pods on both nodes (endpoints written as
records, as pycni-svc will), reaches all three from a client Pod; an empty Service is refused
at once; a NodePort answers from the other node; a Service created, changed and removed while
another one carries traffic; and `pycni svc trace` names exactly where conntrack shows the
connections went. Waits are for the proxy to see a store change, never timed assertions."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections import Counter

import pytest

from services.record import EndpointRecord
from tests.fixtures.echo import WHOAMI_SERVER
from tests.fixtures.waiting import wait_for

from .pods import OverlayCluster, Pod, pycni_cli, python_in

pytestmark = pytest.mark.etcd
SERVER = WHOAMI_SERVER
CLIENT = """
import socket, sys
for _ in range(int(sys.argv[3])):
    try:
        with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2) as s:
            print(s.recv(64).decode() or "empty", flush=True)
    except OSError as exc:
        print(type(exc).__name__, flush=True)
"""
FLOW = """
import os, socket, sys, time
while not os.path.exists(sys.argv[3]):
    try:
        with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2) as s:
            print(s.recv(64).decode() or "empty", flush=True)
    except OSError as exc:
        print(type(exc).__name__, flush=True)
    time.sleep(0.01)
"""


@pytest.fixture(scope="module")
def svc(module_overlay):
    """The cluster, its Pods (three servers labelled app=web, one client) and the web Service."""
    cluster = module_overlay("vxlan", nodes=2, daemon={"services": {"proxy": True}})
    n1, n2 = cluster.nodes
    backends = [cluster.add_pod(n) for n in (n1, n2, n2)]
    client = cluster.add_pod(n1)
    servers = [subprocess.Popen(python_in(p.ns, SERVER)) for p in backends]
    for i, pod in enumerate(backends):
        labels = {"app": "web", **({"pick": "me"} if i == 0 else {})}
        ep = EndpointRecord("ns", f"b{i}", "eth0", (pod.ip,), labels, pod.node.name)
        cluster.cluster.etcd.put(ep.key, ep.to_bytes())
    for node in cluster.nodes:
        route_service_cidr(cluster, node)
    cli(cluster, "config", "set", "--cidr", "10.96.0.0/24", "--node-port-range", "30000-30100")
    web = cli(
        cluster,
        "create",
        "ns/web",
        "--type",
        "NodePort",
        "--port",
        "http:80/TCP:8080",
        "--selector",
        "app=web",
    )["service"]
    yield cluster, backends, client, web
    for server in servers:
        server.kill()
        server.wait()


def route_service_cidr(cluster: OverlayCluster, node) -> None:
    """What a node's default route does on a real node: a VIP is routed (out the underlay),
    so the filter hook that refuses an empty Service sees the packet."""
    address = cluster.records()[node.name]["address"]
    links = json.loads(node.host.ns.run(["ip", "-j", "-4", "addr"]).stdout)
    device = next(
        link["ifname"]
        for link in links
        if any(a["local"] == address for a in link.get("addr_info", ()))
    )
    node.host.ns.run(["ip", "route", "add", "10.96.0.0/24", "dev", device])


def cli(cluster: OverlayCluster, *args: str) -> dict:
    out = pycni_cli(cluster.nodes[0], "svc", *args, "--output", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def connects(pod_ns, ip: str, port: int, count: int) -> list[str]:
    out = subprocess.run(
        python_in(pod_ns, CLIENT) + [ip, str(port), str(count)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def wait_answers(pod: Pod, ip: str, port: int, want: set[str]) -> None:
    """Until 10 connects are answered by exactly ``want`` (the proxy saw the change)."""
    wait_for(
        f"{ip}:{port} answered by {want}",
        lambda: set(connects(pod.ns, ip, port, 10)) == want,
        timeout=15,
        step=0.2,
    )


def test_a_vip_spreads_over_backends_on_both_nodes_and_trace_agrees(svc):
    cluster, backends, client, web = svc
    vip = web["clusterIPs"][0]
    wait_answers(client, vip, 80, {p.ip for p in backends})
    subprocess.run(
        ["ip", "netns", "exec", cluster.nodes[0].host.ns.name, "conntrack", "-F"],
        capture_output=True,
    )
    seen = Counter(connects(client.ns, vip, 80, 300))
    assert set(seen) == {p.ip for p in backends} and all(n >= 60 for n in seen.values()), seen
    doc = cli(
        cluster,
        "trace",
        "--from",
        client.ip,
        "--to",
        f"{vip}:80/tcp",
        "--node",
        cluster.nodes[0].name,
    )
    answer = doc["answer"]
    assert (answer["entry"], answer["verdict"]) == ("ClusterIP", "dnat")
    assert not any(c["masquerade"] for c in answer["choices"])  # Pod to Pod keeps its IP
    tracked = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            cluster.nodes[0].host.ns.name,
            "conntrack",
            "-L",
            "-p",
            "tcp",
            "--orig-dst",
            vip,
        ],
        capture_output=True,
        text=True,
    ).stdout
    replies = {
        line.split("src=")[2].split()[0]
        for line in tracked.splitlines()
        if line.count("src=") == 2
    }
    assert replies == {c["ip"] for c in answer["choices"]} == set(seen)


def test_a_service_without_endpoints_is_refused_at_once(svc):
    cluster, _, client, _ = svc
    empty = cli(
        cluster, "create", "ns/empty", "--port", "80/TCP:8080", "--selector", "app=nobody"
    )["service"]["clusterIPs"][0]
    wait_answers(client, empty, 80, {"ConnectionRefusedError"})
    doc = cli(cluster, "trace", "--from", client.ip, "--to", f"{empty}:80/tcp")
    assert (doc["answer"]["verdict"], doc["answer"]["reason"]) == ("reject", "no endpoints")


def test_a_nodeport_answers_from_the_other_node(svc):
    cluster, backends, _, web = svc
    n1, n2 = cluster.nodes
    address = cluster.records()[n1.name]["address"]
    node_port = web["ports"][0]["nodePort"]
    wait_for(
        "the NodePort answering",
        lambda: set(connects(n2.host.ns, address, node_port, 30)) == {p.ip for p in backends},
        timeout=15,
        step=0.2,
    )
    doc = cli(
        cluster,
        "trace",
        "--from",
        cluster.records()[n2.name]["address"],
        "--to",
        f"{address}:{node_port}/tcp",
        "--node",
        n1.name,
    )
    assert doc["answer"]["entry"] == "NodePort"
    assert all(c["masquerade"] for c in doc["answer"]["choices"])


def test_a_service_created_changed_and_removed_while_traffic_flows(svc):
    cluster, backends, client, web = svc
    vip, stop = web["clusterIPs"][0], os.path.join(tempfile.mkdtemp(), "stop")
    flow = subprocess.Popen(
        python_in(client.ns, FLOW) + [vip, "80", stop], stdout=subprocess.PIPE, text=True
    )
    try:
        live = cli(cluster, "create", "ns/live", "--port", "80/TCP:8080", "--selector", "app=web")[
            "service"
        ]["clusterIPs"][0]
        wait_answers(client, live, 80, {p.ip for p in backends})
        cli(cluster, "set", "ns/live", "--selector", "pick=me")
        wait_answers(client, live, 80, {backends[0].ip})
        cli(cluster, "rm", "ns/live")
        wait_for(
            "the removed VIP answering no more",
            lambda: not set(connects(client.ns, live, 80, 3)) & {p.ip for p in backends},
            timeout=15,
            step=0.2,
        )
    finally:
        open(stop, "w").close()
        out, _ = flow.communicate(timeout=30)
    answers = Counter(out.split())
    assert answers and set(answers) <= {p.ip for p in backends}, answers  # no flow broke


UDP_SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 5353))
while True:
    data, peer = s.recvfrom(64); s.sendto(sys.argv[1].encode(), peer)
"""
UDP_PROBE = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 40053))
s.connect((sys.argv[1], 53)); s.settimeout(1)
try:
    s.send(b"q"); print(s.recv(64).decode())
except OSError as exc:
    print(type(exc).__name__)
"""


def test_udp_conntrack_of_an_empty_service_is_cleaned_when_endpoints_come(svc):
    """0 -> 1 endpoints: the entry the refused datagrams made (reply source the VIP itself)
    would keep the client's socket off the new backend until it idles out; the proxy deletes
    it after the sync, so the same source port reaches the backend."""
    cluster, backends, client, _ = svc
    server = subprocess.Popen(python_in(backends[1].ns, UDP_SERVER) + [backends[1].ip])
    try:
        vip = cli(
            cluster, "create", "ns/dns", "--port", "dns:53/UDP:5353", "--selector", "app=dns"
        )["service"]["clusterIPs"][0]

        def probe() -> str:
            out = subprocess.run(
                python_in(client.ns, UDP_PROBE) + [vip], capture_output=True, text=True, timeout=30
            )
            return out.stdout.strip()

        wait_for(
            "the empty UDP Service refusing",
            lambda: probe() == "ConnectionRefusedError",
            timeout=15,
            step=0.2,
        )
        ep = EndpointRecord(
            "ns", "dns0", "eth0", (backends[1].ip,), {"app": "dns"}, backends[1].node.name
        )
        cluster.cluster.etcd.put(ep.key, ep.to_bytes())
        wait_for(
            "the same source port reaching the new backend",
            lambda: probe() == backends[1].ip,
            timeout=15,
            step=0.2,
        )
    finally:
        server.kill()
        server.wait()

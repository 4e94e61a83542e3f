"""The proxy's kube-proxy settings with real packets, IPv4 and IPv6: the table is rendered from
store records through the proxy's own path (``calc_model`` under the parsed ``services``
config) into a node namespace that routes between a Pod on a bridge, a backend and an
off-cluster host (two node addresses on its link).

- ``nodePortAddresses``: a NodePort answers on a node address inside the CIDRs, not on one
  outside them (by default it answers on both);
- ``masqueradeAll``: a Pod reaching a ClusterIP arrives at the backend from the node's address
  (by default with its own);
- ``detectLocalMode: BridgeInterface``: a Pod source outside the cluster CIDRs that comes in on
  the bridge keeps its address (local), while ``ClusterCIDR`` masquerades it; an off-cluster
  host is masqueraded either way. The same detection decides who an externalTrafficPolicy
  Local NodePort short-circuits to every endpoint: that Pod under ``BridgeInterface`` (it is
  in-cluster traffic), not under ``ClusterCIDR`` (it is external: the local endpoint only)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Any

import pytest

from nodes.record import NodeRecord
from services.proxy.config import parse_proxy_config
from services.proxy.table import render_transaction
from services.proxy.view import Records, calc_model
from services.record import EndpointRecord, ServicePort, ServiceRecord, ServiceSettings
from store.base import KV
from tests.fixtures.echo import PEER_SERVER as SERVER

pytestmark = pytest.mark.netns
NODE_PORT = 30080
BRIDGE = "br-svc0"
PLAN = {
    4: {
        "plen": 24,
        "pool": "10.0.0.0/15",
        "cidr": "10.96.0.0/16",
        "vip": "10.96.0.10",
        "gw": "10.0.0.1",
        "pod": "10.0.0.5",
        "foreign": "172.20.0.5",  # a Pod source outside the cluster CIDRs
        "node_srv": "10.1.0.1",
        "srv": "10.1.0.2",
        "srv2": "10.1.0.3",  # an endpoint the records place on another node
        "node_ext": ("192.168.0.2", "198.51.100.2"),
        "ext": ("192.168.0.100", "198.51.100.100"),
        "inside": "192.168.0.0/24",
    },
    6: {
        "plen": 64,
        "pool": "fd10::/63",
        "cidr": "fd96::/112",
        "vip": "fd96::10",
        "gw": "fd10::1",
        "pod": "fd10::5",
        "foreign": "fd20::5",
        "node_srv": "fd10:0:0:1::1",
        "srv": "fd10:0:0:1::2",
        "srv2": "fd10:0:0:1::3",
        "node_ext": ("fd01::2", "fd02::2"),
        "ext": ("fd01::100", "fd02::100"),
        "inside": "fd01::/64",
    },
}
CLIENT = """
import socket, sys, time
ip, port, source = sys.argv[1], int(sys.argv[2]), sys.argv[3]
family = socket.AF_INET6 if ":" in ip else socket.AF_INET
for attempt in range(50):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        if source: s.bind((source, 0))
        s.connect((ip, port)); print(s.recv(128).decode()); break
    except ConnectionRefusedError:
        if sys.argv[4] == "refused": print("ConnectionRefusedError"); break
        time.sleep(0.1)
    except TimeoutError:  # "wait": a fresh link's first packets (IPv6 ND) may go unanswered
        if sys.argv[4] != "wait" or attempt >= 4: print("TimeoutError"); break
    except OSError as exc:
        print(type(exc).__name__); break
    finally:
        s.close()
"""


def run_all(ns, commands: list[str]) -> None:
    for command in commands:
        ns.run(command)


@pytest.fixture
def site(netns_factory):
    """node (the table; bridge to the Pod, link to the backend, link to the outside host)."""
    node, pod, srv, ext = (netns_factory(r) for r in ("svcnode", "svcpod", "svcsrv", "svcext"))
    run_all(
        node,
        [
            "sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1",
            f"ip link add {BRIDGE} type bridge",
            f"ip link set {BRIDGE} up",
            f"ip link add pv0 type veth peer name eth0 netns {pod.name}",
            f"ip link set pv0 master {BRIDGE} up",
            f"ip link add sv0 type veth peer name eth0 netns {srv.name}",
            "ip link set sv0 up",
            f"ip link add xv0 type veth peer name eth0 netns {ext.name}",
            "ip link set xv0 up",
        ],
    )
    for ns in (pod, srv, ext):
        ns.run("ip link set eth0 up && ip link set lo up")
    for p in PLAN.values():
        n = p["plen"]
        run_all(
            node,
            [
                f"ip addr add {p['gw']}/{n} dev {BRIDGE} nodad",
                f"ip route add {p['foreign']} dev {BRIDGE}",
                f"ip addr add {p['node_srv']}/{n} dev sv0 nodad",
                *(f"ip addr add {a}/{n} dev xv0 nodad" for a in p["node_ext"]),
            ],
        )
        run_all(
            pod,
            [
                f"ip addr add {p['pod']}/{n} dev eth0 nodad",
                f"ip addr add {p['foreign']} dev eth0 nodad",
                f"ip route add default via {p['gw']}",
            ],
        )
        run_all(
            srv,
            [
                f"ip addr add {p['srv']}/{n} dev eth0 nodad",
                f"ip addr add {p['srv2']}/{n} dev eth0 nodad",
                f"ip route add default via {p['node_srv']}",
            ],
        )
        run_all(
            ext,
            [
                *(f"ip addr add {a}/{n} dev eth0 nodad" for a in p["ext"]),
                f"ip route add {p['cidr']} via {p['node_ext'][0]}",
            ],
        )
    server = subprocess.Popen(["ip", "netns", "exec", srv.name, sys.executable, "-c", SERVER])
    try:
        yield {"node": node, "pod": pod, "ext": ext}
    finally:
        server.kill()
        server.wait()


def calc_records(local: bool = False) -> Records:
    """A dual-stack NodePort Service with one backend, as the store holds it; ``local``: with
    externalTrafficPolicy Local and a second endpoint on another node (n2)."""
    records = Records()
    for family, p in PLAN.items():
        records.pools[f"pool{family}"] = p["pool"]
    records.settings = ServiceSettings(tuple(p["cidr"] for p in PLAN.values()))
    records.nodes["n1"] = NodeRecord("n1", PLAN[4]["node_ext"][0])
    svc = ServiceRecord(
        "ns",
        "web",
        "NodePort",
        (ServicePort("http", "TCP", 80, 8080, NODE_PORT),),
        tuple(p["vip"] for p in PLAN.values()),
        (),
        {"app": "web"},
    )
    ep = EndpointRecord(
        "ns", "srv", "eth0", tuple(p["srv"] for p in PLAN.values()), {"app": "web"}, "n1"
    )
    remote = EndpointRecord(
        "ns", "srv2", "eth0", tuple(p["srv2"] for p in PLAN.values()), {"app": "web"}, "n2"
    )
    if local:
        svc = dataclasses.replace(svc, external_traffic_policy="Local")
    for record in (svc, ep, *[remote] * local):
        records.apply(KV(record.key, record.to_bytes(), 0))
    return records


def program(node, family: int, settings: dict[str, Any], etp_local: bool = False) -> None:
    """The node's table for ``family`` under the ``services`` section ``settings``."""
    config = parse_proxy_config({"services": {"proxy": True, **settings}})
    assert config is not None
    p = PLAN[family]
    local = [p["gw"], p["node_srv"], *p["node_ext"]]
    model = calc_model(calc_records(etp_local), "n1", family, local, config)
    table = "ip6" if family == 6 else "ip"
    node.run(f"nft delete table {table} pycni-svc", check=False)
    node.run(["nft", "-f", "-"], input=render_transaction(None, model))


def ask(ns, ip: str, port: int, source: str = "", refused: str = "refused") -> str:
    """``backend,peer`` as the backend saw it, or the client's error."""
    out = ns.run([sys.executable, "-c", CLIENT, ip, str(port), source, refused]).stdout.split()
    return out[0] if out else "nothing"


@pytest.mark.parametrize("family", [4, 6])
def test_a_node_port_answers_only_on_node_port_addresses(site, family):
    p = PLAN[family]
    inside, outside = p["node_ext"]
    program(site["node"], family, {})  # default: every global address of the node
    assert ask(site["ext"], inside, NODE_PORT, refused="wait").startswith(f"{p['srv']},")
    assert ask(site["ext"], outside, NODE_PORT).startswith(f"{p['srv']},")
    program(site["node"], family, {"nodePortAddresses": [p["inside"]]})
    assert ask(site["ext"], inside, NODE_PORT).startswith(f"{p['srv']},")
    assert ask(site["ext"], outside, NODE_PORT) == "ConnectionRefusedError"  # the node's own
    program(site["node"], family, {"nodePortAddresses": ["primary"]})
    primary = ask(site["ext"], inside, NODE_PORT)
    assert (
        primary.startswith(f"{p['srv']},")
        if family == 4
        else primary
        == (
            "ConnectionRefusedError"  # the node record's address is IPv4: no IPv6 NodePort
        )
    )
    assert ask(site["ext"], outside, NODE_PORT) == "ConnectionRefusedError"


@pytest.mark.parametrize("family", [4, 6])
def test_masquerade_all_hides_the_pod_address_from_the_backend(site, family):
    p = PLAN[family]
    program(site["node"], family, {})
    assert ask(site["pod"], p["vip"], 80, p["pod"], "wait") == f"{p['srv']},{p['pod']}"
    program(site["node"], family, {"masqueradeAll": True})
    assert ask(site["pod"], p["vip"], 80, p["pod"]) == f"{p['srv']},{p['node_srv']}"


@pytest.mark.parametrize("family", [4, 6])
def test_bridge_detection_treats_a_pod_source_outside_the_cluster_cidrs_as_local(site, family):
    p = PLAN[family]
    program(site["node"], family, {})  # ClusterCIDR: that source is not the cluster's
    assert ask(site["pod"], p["vip"], 80, p["foreign"], "wait") == f"{p['srv']},{p['node_srv']}"
    bridge = {"detectLocalMode": "BridgeInterface", "detectLocal": {"bridgeInterface": "br-svc"}}
    program(site["node"], family, bridge)
    assert ask(site["pod"], p["vip"], 80, p["foreign"]) == f"{p['srv']},{p['foreign']}"
    # the first reply to the Pod's own address resolves its neighbour on the bridge: "wait"
    assert ask(site["pod"], p["vip"], 80, p["pod"], "wait") == f"{p['srv']},{p['pod']}"
    off_cluster = ask(site["ext"], p["vip"], 80, p["ext"][0])  # not on the bridge
    assert off_cluster == f"{p['srv']},{p['node_srv']}"


MANY = f"""
import sys
for _ in range(int(sys.argv.pop())):
    exec({CLIENT!r}, {{}})
"""


def ask_many(ns, ip: str, port: int, source: str, count: int = 16) -> set[str]:
    """The backends ``count`` connects from ``source`` reach (each picks at random)."""
    argv = [sys.executable, "-c", MANY, ip, str(port), source, "wait", str(count)]
    return {line.split(",")[0] for line in ns.run(argv).stdout.split()}


@pytest.mark.parametrize("family", [4, 6])
def test_bridge_detection_short_circuits_a_local_policy_node_port_for_a_pod(site, family):
    p = PLAN[family]
    node_ip, both = p["node_ext"][0], {p["srv"], p["srv2"]}
    program(site["node"], family, {}, etp_local=True)  # ClusterCIDR: that source is external
    assert ask_many(site["pod"], node_ip, NODE_PORT, p["foreign"]) == {p["srv"]}
    assert ask_many(site["pod"], node_ip, NODE_PORT, p["pod"]) == both  # in-cluster traffic
    bridge = {"detectLocalMode": "BridgeInterface", "detectLocal": {"bridgeInterface": "br-svc"}}
    program(site["node"], family, bridge, etp_local=True)
    assert ask_many(site["pod"], node_ip, NODE_PORT, p["foreign"]) == both
    assert ask_many(site["ext"], node_ip, NODE_PORT, p["ext"][0]) == {p["srv"]}  # external

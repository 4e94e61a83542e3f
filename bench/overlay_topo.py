"""The topologies of the overlay benchmarks: pycni's (real pycnids on etcd) and one built by hand.

pycni:      tests/fixtures/cluster.py (underlay bridge namespace, etcd in a control-plane
            namespace, node namespaces 172.31.250.11..), each node running pycnid with the
            ``overlay`` section, a pool with /26 blocks, Pods added through pycni-bridge.
hand-built: the same shape made with ``ip`` commands only (what the overlay is held against):
            underlay bridge ``br0``, nodes 192.168.77.N on veths, a bridge ``cni0`` 10.244.N.1/24
            per node and one Pod (default via .1); host-gw: ``10.244.M.0/24 via 192.168.77.M``;
            vxlan: ``vx0`` (VNI 1, dstport 4789, nolearning, MTU 1450), a /32 VTEP, a permanent
            neighbour, an FDB entry and an onlink route per peer. No nft, no proxy ARP.

Both are made only inside namespaces this run creates; nothing touches the root namespace.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass

from tests.fixtures.cluster import Cluster, ClusterNode
from tests.overlay.pods import OverlayCluster, Pod, pod_conf

from .common import REFERENCE_BIN, Sandbox, sh

HAND_UNDERLAY = "192.168.77"
HAND_PODS = "10.244"
VXLAN_MTU = 1450
IPERF_PORT = 5201
QUIET_DAEMON = {"logLevel": "warning", "faultInjection": False}


# --- pycni ---------------------------------------------------------------------------------
def start_cluster(
    backend: str,
    nodes: int,
    cni_bin: str,
    cidr: str = "10.131.0.0/16",
    daemon: dict | None = None,
    **overlay: object,
) -> OverlayCluster:
    """An etcd and ``nodes`` pycnids with the overlay (``daemon``: more pycnid config keys),
    one pool; the caller closes it (``built.cluster.close()``) also after a failure."""
    cluster = Cluster.create(1)
    built = OverlayCluster(
        cluster, cni_bin, f"{cni_bin}:{REFERENCE_BIN}", backend, {"backend": backend, **overlay}
    )
    try:
        cluster.etcd.start()
        for _ in range(nodes):
            add_quiet_node(built, daemon)
        built.add_pool("pods", cidr, 26)
        built.wait_vteps(timeout=20.0 + 2.0 * nodes)
    except AssertionError as exc:  # wait_for's timeout: say what the daemons said
        logs = "\n".join(f"{n.name}: ...{n.daemon.log()[-800:]}" for n in cluster.nodes)
        cluster.close()
        raise RuntimeError(f"{backend} cluster: {exc}\n{logs}") from None
    except BaseException:
        cluster.close()
        raise
    return built


def add_quiet_node(
    built: OverlayCluster, daemon: dict | None = None, **overlay: object
) -> ClusterNode:
    """A node whose pycnid logs warnings only and has no fault points (as in production)."""
    return built.cluster.add_node(
        mtu=built.mtu, overlay={**built.overlay, **overlay}, **{**QUIET_DAEMON, **(daemon or {})}
    )


def pycni_pods(built: OverlayCluster) -> tuple[Pod, Pod]:
    """One Pod on each of the first two nodes, without ipMasq: the hand-built topology has no
    NAT either (a NAT chain switches conntrack on for every packet), so like meets like."""
    conf = pod_conf(ipMasq=False)
    return built.add_pod(built.nodes[0], conf), built.add_pod(built.nodes[1], conf)


# --- hand-built ----------------------------------------------------------------------------
@dataclass(frozen=True)
class HandPod:
    ns: str  # namespace name
    ip: str


def ns_sh(ns: str, script: str) -> None:
    sh(["ip", "netns", "exec", ns, "sh", "-ec", script])


def build_hand(box: Sandbox, backend: str, tag: str) -> tuple[HandPod, HandPod]:
    """Two nodes with one Pod each, wired for ``backend`` by hand; returns the Pods."""
    ul = box.netns(f"{tag}ul")
    ns_sh(ul, "ip link add br0 type bridge && ip link set br0 up")
    mtu = VXLAN_MTU if backend == "vxlan" else 1500
    nodes = [setup_hand_node(box, ul, tag, n, mtu) for n in (1, 2)]
    for n, node in enumerate(nodes, 1):
        peer = 3 - n
        if backend == "vxlan":
            setup_hand_vxlan(node, n, peer)
        else:
            ns_sh(
                node,
                f"ip route add {HAND_PODS}.{peer}.0/24 via {HAND_UNDERLAY}.{peer} "
                "dev eth0 proto 201",
            )
    return tuple(setup_hand_pod(box, node, tag, n, mtu) for n, node in enumerate(nodes, 1))


def setup_hand_node(box: Sandbox, ul: str, tag: str, n: int, mtu: int) -> str:
    node = box.netns(f"{tag}n{n}")
    sh(
        [
            "ip",
            "-n",
            ul,
            "link",
            "add",
            f"p{n}",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            node,
        ]
    )
    ns_sh(ul, f"ip link set p{n} master br0 up")
    ns_sh(
        node,
        f"ip link set eth0 up && ip addr add {HAND_UNDERLAY}.{n}/24 dev eth0 && "
        "sysctl -qw net.ipv4.ip_forward=1 && "
        f"ip link add cni0 mtu {mtu} type bridge && "
        f"ip addr add {HAND_PODS}.{n}.1/24 dev cni0 && ip link set cni0 up",
    )
    return node


def hand_mac(n: int) -> str:
    return f"66:00:00:00:77:{n:02x}"


def setup_hand_vxlan(node: str, n: int, peer: int) -> None:
    vtep = f"{HAND_PODS}.{peer}.0"
    ns_sh(
        node,
        f"ip link add vx0 address {hand_mac(n)} mtu {VXLAN_MTU} type vxlan id 1 "
        f"dstport 4789 local {HAND_UNDERLAY}.{n} dev eth0 nolearning && "
        f"ip addr add {HAND_PODS}.{n}.0/32 dev vx0 && ip link set vx0 up && "
        f"ip neigh replace {vtep} lladdr {hand_mac(peer)} dev vx0 nud permanent && "
        f"bridge fdb append {hand_mac(peer)} dev vx0 dst {HAND_UNDERLAY}.{peer} "
        "self permanent && "
        f"ip route add {HAND_PODS}.{peer}.0/24 via {vtep} dev vx0 onlink proto 201",
    )


def setup_hand_pod(box: Sandbox, node: str, tag: str, n: int, mtu: int) -> HandPod:
    pod = box.netns(f"{tag}pod{n}")
    ip = f"{HAND_PODS}.{n}.2"
    sh(
        [
            "ip",
            "-n",
            node,
            "link",
            "add",
            f"veth{n}",
            "mtu",
            str(mtu),
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "mtu",
            str(mtu),
            "netns",
            pod,
        ]
    )
    ns_sh(node, f"ip link set veth{n} master cni0 up")
    ns_sh(
        pod,
        f"ip link set eth0 up && ip addr add {ip}/24 dev eth0 && "
        f"ip route add default via {HAND_PODS}.{n}.1",
    )
    return HandPod(pod, ip)


# --- iperf3 --------------------------------------------------------------------------------
def start_iperf_server(box: Sandbox, ns: str) -> subprocess.Popen:
    """iperf3 -s in ``ns``, stopped with the sandbox."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, "iperf3", "-s", "-p", str(IPERF_PORT)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    box.processes.append(proc)
    return proc


def run_iperf(ns: str, server_ip: str, seconds: float) -> float:
    """One TCP stream from ``ns`` to ``server_ip`` (first second omitted: slow start);
    received bits per second."""
    last = ""
    for _ in range(20):  # the server may still be starting
        out = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                "iperf3",
                "-c",
                server_ip,
                "-p",
                str(IPERF_PORT),
                "-t",
                f"{seconds:g}",
                "-O",
                "1",
                "-J",
            ],
            capture_output=True,
            text=True,
            timeout=seconds + 30,
        )
        data = json.loads(out.stdout or "{}")
        if out.returncode == 0 and "sum_received" in data.get("end", {}):
            return float(data["end"]["sum_received"]["bits_per_second"])
        last = data.get("error") or out.stderr or json.dumps(data.get("end"))[:300]
        time.sleep(0.2)
    raise RuntimeError(f"iperf3 {ns} -> {server_ip} failed: {last}")

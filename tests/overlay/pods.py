"""An overlay cluster under test: nodes with pycnid's overlay, a pool, Pods on the nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

from tests.cluster.load import REPO, pycni_ipam_cli
from tests.fixtures.bridge import BridgeNode, ip_of
from tests.fixtures.cluster import Cluster, ClusterNode, Host
from tests.fixtures.daemon import SCRAPE, parse_samples
from tests.fixtures.netns import Netns, new_netns
from tests.fixtures.waiting import wait_for

NETWORK = "overlaynet"
BRIDGE = "pycni0"


def pod_conf(pool: str = "pods", **keys: object) -> dict:
    return {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "pycni-bridge",
        "bridge": BRIDGE,
        "isGateway": True,
        "isDefaultGateway": True,
        "ipMasq": True,
        "ipam": {"type": "pycni-ipam", "pools": [pool], "routes": [{"dst": "0.0.0.0/0"}]},
        **keys,
    }


@dataclass
class Pod:
    ns: Netns
    node: ClusterNode
    container_id: str
    result: dict

    @property
    def ip(self) -> str:
        return ip_of(self.result)


@dataclass
class OverlayCluster:
    cluster: Cluster
    cni_bin: str
    cni_path: str
    backend: str
    overlay: dict
    mtu: int = 1500
    daemon: dict = field(default_factory=dict)  # pycnid config keys of every node
    pods: list[Pod] = field(default_factory=list)

    @property
    def nodes(self) -> list[ClusterNode]:
        return self.cluster.nodes

    def add_node(
        self, name: str | None = None, start: bool = True, **overlay: object
    ) -> ClusterNode:
        keys = {"backend": self.backend, **self.overlay, **overlay}
        return self.cluster.add_node(name, mtu=self.mtu, start=start, overlay=keys, **self.daemon)

    def add_pool(self, name: str, cidr: str, block_size: int) -> None:
        out = pycni_ipam_cli(
            self.nodes[0], "pool", "add", name, "--cidr", cidr, "--block-size", str(block_size)
        )
        assert out.returncode == 0, out.stderr

    def records(self) -> dict[str, dict]:
        return {
            key.rsplit("/", 1)[1]: json.loads(value)
            for key, (value, _) in self.cluster.etcd.dump("/pycni/v1/nodes/").items()
        }

    def wait_vteps(self, enough=None, timeout: float = 20.0) -> dict[str, dict]:
        """Every node's record with its overlay fields (``enough(overlay)`` true of each)."""
        enough = enough or (lambda overlay: self.backend != "vxlan" or overlay["vteps"])

        def ready() -> dict | None:
            records = self.records()
            done = all(
                "overlay" in records.get(n.name, {}) and enough(records[n.name]["overlay"])
                for n in self.nodes
            )
            return records if done else None

        return wait_for("every node's overlay fields in its record", ready, timeout)

    def runner(self, node: ClusterNode) -> BridgeNode:
        return BridgeNode(
            node=node.host.ns,
            socket=node.socket,
            exe=os.path.join(self.cni_bin, "pycni-bridge"),
            cni_path=self.cni_path,
            store_path="",
            host_local_dir="",
        )

    def add_pod(self, node: ClusterNode, conf: dict | None = None) -> Pod:
        ns = new_netns(f"{node.name}p")
        self.cluster.underlay.hosts.append(Host(ns, ""))  # removed with the underlay
        cid, result = self.runner(node).add(conf or pod_conf(), ns)
        pod = Pod(ns, node, cid, result)
        self.pods.append(pod)
        return pod

    def del_pod(self, pod: Pod, conf: dict | None = None) -> None:
        res = self.runner(pod.node).run("DEL", conf or pod_conf(), pod.container_id, pod.ns.path)
        assert res.code == 0, res.stdout
        self.pods.remove(pod)

    def close_pods(self) -> None:
        self.pods.clear()  # their namespaces go with the underlay, the cluster with its fixture


SERVER = """
import hashlib, socket
srv = socket.socket(socket.AF_INET6 if ':' in {ip!r} else socket.AF_INET)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(({ip!r}, {port})); srv.listen(1); srv.settimeout(30)
print('ready', flush=True)
conn, _ = srv.accept(); conn.settimeout(30); digest = hashlib.sha256(); size = 0
while chunk := conn.recv(1 << 16):
    digest.update(chunk); size += len(chunk)
print(size, digest.hexdigest(), flush=True)
"""
CLIENT = """
import hashlib, os, socket
data = os.urandom({size})
conn = socket.create_connection(({ip!r}, {port}), timeout=30)
conn.sendall(data); conn.shutdown(socket.SHUT_WR); conn.recv(1)
print(len(data), hashlib.sha256(data).hexdigest(), flush=True)
"""


def python_in(ns: Netns, script: str) -> list[str]:
    return ["ip", "netns", "exec", ns.name, sys.executable, "-c", script]


def tcp_transfer(src: Pod, dst: Pod, size: int, port: int = 5201) -> tuple[str, str]:
    """``size`` random bytes sent from ``src`` to a server in ``dst`` by a Pod IP: (what the
    client sent, what the server received), each as "<bytes> <sha256>"."""
    server = subprocess.Popen(
        python_in(dst.ns, SERVER.format(ip=dst.ip, port=port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout.readline().strip() == "ready", server.stderr.read()
        sent = subprocess.run(
            python_in(src.ns, CLIENT.format(ip=dst.ip, port=port, size=size)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        received, errors = server.communicate(timeout=60)
    finally:
        server.kill()
    assert sent.returncode == 0, sent.stderr
    return sent.stdout.strip(), received.strip() or errors


def pycni_cli(node: ClusterNode, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`pycni ARGS` run inside the node's namespace with its daemon's config."""
    cmd = [
        "ip",
        "netns",
        "exec",
        node.host.ns.name,
        sys.executable,
        "-m",
        "cli",
        *args,
        "--config",
        os.path.join(node.daemon.workdir, "pycnid.json"),
    ]
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": REPO},
    )


def running(nodes: list[ClusterNode]) -> list[ClusterNode]:
    """The nodes whose pycnid runs (a node crashed or stopped by a test is left out)."""
    return [n for n in nodes if n.daemon.proc is not None and n.daemon.proc.poll() is None]


METRICS = "127.0.0.1:9464"  # metricsAddress in each node's own namespace


def scrape(node: ClusterNode, address: str = METRICS) -> dict[str, float]:
    """The node's pycnid metrics (fetched inside its namespace) as {'name{labels}': value}."""
    out = subprocess.run(
        python_in(node.host.ns, SCRAPE % address), capture_output=True, text=True, timeout=10
    )
    assert out.returncode == 0, out.stderr
    return parse_samples(out.stdout)


def wait_synced(node: ClusterNode, passes: int = 1, timeout: float = 10.0) -> None:
    """Until the node's overlay sync has completed ``passes`` reconcile passes since pycnid
    started (its histogram's count)."""
    wait_for(
        f"{passes} overlay pass(es) on {node.name}",
        lambda: scrape(node).get("pycni_overlay_sync_seconds_count", 0) >= passes,
        timeout,
        step=0.1,
    )

"""Service tests whose Pods are added the way a runtime adds them: one conflist, pycni-bridge
then pycni-svc, run by `pycni net` (libcni's behaviour, its result cache) inside each node's
namespace, so the endpoints are published and withdrawn by the plugin from K8S_POD_NAMESPACE /
K8S_POD_NAME and PYCNI_LABELS in CNI_ARGS, never written by hand.

Also the scripts those Pods run: a backend answering TCP with who it is and who it saw (the
peer shows masquerade), and UDP with its address; a UDP client that keeps one socket."""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass, field

from cni.runtime.tool import container_id_for
from tests.fixtures.cluster import ClusterNode, Host
from tests.fixtures.cnirun import Runner, write_network
from tests.fixtures.netns import new_netns

from .pods import NETWORK, OverlayCluster, Pod, pod_conf, python_in

BACKEND = """
import socket, socketserver, sys, threading
class H(socketserver.BaseRequestHandler):
    def handle(self):
        local, peer = self.request.getsockname()[0], self.request.getpeername()[0]
        self.request.sendall(f"{local},{peer}".encode())
class S(socketserver.ThreadingTCPServer): allow_reuse_address = True; daemon_threads = True
threading.Thread(target=S(("0.0.0.0", 8080), H).serve_forever, daemon=True).start()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((sys.argv[1], 5353))
while True:
    _, peer = u.recvfrom(64); u.sendto(sys.argv[1].encode(), peer)
"""
UDP_FLOW = """
import os, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 40054))
s.connect((sys.argv[1], int(sys.argv[2]))); s.settimeout(0.3)
while not os.path.exists(sys.argv[3]):
    try:
        s.send(b"q"); print(s.recv(64).decode(), flush=True)
    except OSError as exc:
        print(type(exc).__name__, flush=True)
    time.sleep(0.02)
"""


def svc_conflist() -> dict:
    """The overlay's Pod network (pods.pod_conf) with pycni-svc chained after the bridge.

    ``hairpinMode`` as kubelet asks of its bridge: with br_netfilter loaded (bridged frames
    through the ip hooks), a Pod DNATed to itself must leave by the port it came in on."""
    conf = pod_conf(hairpinMode=True)
    bridge = {k: v for k, v in conf.items() if k not in ("cniVersion", "name")}
    return {"cniVersion": "1.0.0", "name": NETWORK, "plugins": [bridge, {"type": "pycni-svc"}]}


@dataclass
class SvcPod(Pod):
    namespace: str = ""
    name: str = ""
    server: subprocess.Popen | None = None

    @property
    def cni_args(self) -> str:
        return f"K8S_POD_NAMESPACE={self.namespace};K8S_POD_NAME={self.name}"


@dataclass
class ConflistPods:
    """Pods of one cluster attached through the conflist; ``close()`` deletes those left."""

    cluster: OverlayCluster
    root: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="svcpods"))
    pods: list[SvcPod] = field(default_factory=list)

    def runner(self, node: ClusterNode) -> Runner:
        """`pycni net` in the node's namespace with that node's conf dir, cache and pycnid."""
        base = os.path.join(self.root, node.name)
        conf_dir = os.path.join(base, "net.d")
        if not os.path.exists(conf_dir):
            write_network(conf_dir, svc_conflist())
        return Runner(
            "pycni",
            node.host.ns,
            conf_dir,
            os.path.join(base, "cache"),
            self.cluster.cni_path,
            extra_env={"PYCNI_SOCKET": node.socket},
        )

    def add(
        self,
        node: ClusterNode,
        namespace: str,
        name: str,
        labels: dict[str, str],
        serve: bool = True,
    ) -> SvcPod:
        """ADD through the conflist (labels as CNI_ARGS PYCNI_LABELS); ``serve`` starts the
        BACKEND script in the Pod."""
        ns = new_netns(f"{node.name}s")
        self.cluster.cluster.underlay.hosts.append(Host(ns, ""))  # removed with the underlay
        pod = SvcPod(ns, node, container_id_for(ns.path), {}, namespace, name)
        label_arg = ",".join(f"{k}:{v}" for k, v in labels.items())
        out = self.runner(node).must(
            "add", NETWORK, ns.path, cni_args=f"{pod.cni_args};PYCNI_LABELS={label_arg}"
        )
        pod.result = out.json
        self.pods.append(pod)
        if serve:
            pod.server = subprocess.Popen(python_in(ns, BACKEND) + [pod.ip])
        return pod

    def delete(self, pod: SvcPod) -> None:
        """DEL through the conflist, as the runtime does when the Pod goes."""
        self.runner(pod.node).must("del", NETWORK, pod.ns.path, cni_args=pod.cni_args)
        self.pods.remove(pod)
        stop(pod.server)

    def close(self) -> None:
        for pod in list(self.pods):
            self.runner(pod.node).run("del", NETWORK, pod.ns.path, cni_args=pod.cni_args)
            stop(pod.server)
        self.pods.clear()


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        proc.kill()
        proc.wait()

"""An overlay cluster under test: nodes with pycnid's overlay, a pool, Pods on the nodes."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from tests.cluster.load import pycni_ipam_cli
from tests.fixtures.bridge import BridgeNode, ip_of
from tests.fixtures.cluster import Cluster, ClusterNode, Host
from tests.fixtures.netns import Netns, new_netns
from tests.fixtures.waiting import wait_for

NETWORK = "overlaynet"
BRIDGE = "pycni0"


def pod_conf(pool: str = "pods", **keys: object) -> dict:
    return {"cniVersion": "1.0.0", "name": NETWORK, "type": "pycni-bridge", "bridge": BRIDGE,
            "isGateway": True, "isDefaultGateway": True, "ipMasq": True,
            "ipam": {"type": "pycni-ipam", "pools": [pool], "routes": [{"dst": "0.0.0.0/0"}]},
            **keys}


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
    pods: list[Pod] = field(default_factory=list)

    @property
    def nodes(self) -> list[ClusterNode]:
        return self.cluster.nodes

    def add_node(self, name: str | None = None, **overlay: object) -> ClusterNode:
        keys = {"backend": self.backend, **self.overlay, **overlay}
        return self.cluster.add_node(name, mtu=self.mtu, overlay=keys)

    def add_pool(self, name: str, cidr: str, block_size: int) -> None:
        out = pycni_ipam_cli(self.nodes[0], "pool", "add", name, "--cidr", cidr,
                             "--block-size", str(block_size))
        assert out.returncode == 0, out.stderr

    def records(self) -> dict[str, dict]:
        return {key.rsplit("/", 1)[1]: json.loads(value) for key, (value, _) in
                self.cluster.etcd.dump("/pycni/v1/nodes/").items()}

    def wait_vteps(self, timeout: float = 20.0) -> dict[str, dict]:
        def ready() -> dict | None:
            records = self.records()
            done = all("overlay" in records.get(n.name, {}) and
                       (self.backend != "vxlan" or records[n.name]["overlay"]["vteps"])
                       for n in self.nodes)
            return records if done else None
        return wait_for("every node's overlay fields in its record", ready, timeout)

    def runner(self, node: ClusterNode) -> BridgeNode:
        return BridgeNode(node=node.host.ns, socket=node.socket,
                          exe=os.path.join(self.cni_bin, "pycni-bridge"),
                          cni_path=self.cni_path, store_path="", host_local_dir="")

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

"""A new Pod is isolated before its ADD returns, under the Kubernetes source.

kubelet writes a Pod's ``status.podIPs`` only after the CNI ADD returned, so the API server
does not know a new Pod's address when its containers start. One node: pycnid in a node netns
follows a fake API server (tests/fixtures/kubeapi.py, on the node's loopback) and enforces
NetworkPolicy; Pods get their network from pycni-bridge alone, as in
``conf/kubernetes/30-config.yaml``. The Pod objects carry labels but never addresses (no
kubelet here): only the ADD can tell NetworkPolicy where the Pod is.

- a Pod a deny-all-ingress policy selects refuses a connection made right after its ADD
  returned (its server listened before the ADD), while an unselected Pod's ADD is answered
  at once; after DEL the table no longer names the address;
- pycnid restarted before kubelet would have written the addresses keeps that Pod isolated
  (the attachment is taken back from pycni-ipam's handle);
- an ADD for a Pod the API server does not have fails with code 11 naming the Pod within the
  settle timeout (``netpol.sync.SETTLE``) and leaves nothing behind;
- the ADD's cost of isolating (pycnid's own "ms" of each request, 10 of each, printed): ADDs
  naming the Pod against ADDs without CNI_ARGS' Pod (nothing to isolate) on the same pycnid.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest

from netpol.render import TABLE
from netpol.sync import SETTLE
from tests.fixtures.bridge import (
    bridge_conf,
    ip_of,
    ipam_handles,
    masq_elements,
    new_cid,
    node_veths,
    pycni_ipam,
)
from tests.fixtures.daemon import Pycnid, daemon_config
from tests.fixtures.kubeapi import FakeKubeAPI, namespace, network_policy, pod
from tests.fixtures.netns import Netns, new_netns
from tests.fixtures.plugins import PluginRun, run_plugin
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.netns
NODE = "node1"
NETWORK = "podnet"
SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 80)); s.listen(64); print("ready", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"x"); c.close()
"""
CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], 80), timeout=float(sys.argv[2])) as s:
        print(s.recv(1) == b"x")
except OSError:
    print(False)
"""


@dataclass
class KubeNode:
    node: Netns
    api: FakeKubeAPI
    pycnid: Pycnid
    cni_bin: str
    cni_path: str
    stack: ExitStack

    def run(self, command: str, cid: str, netns: str, args: str) -> PluginRun:
        return run_plugin(
            f"{self.cni_bin}/pycni-bridge",
            command,
            bridge_conf(pycni_ipam(), name=NETWORK, isDefaultGateway=True),
            container_id=cid,
            netns=netns,
            args=args,
            cni_path=self.cni_path,
            socket=self.pycnid.socket,
        )

    def netns(self, role: str) -> Netns:
        made = new_netns(role)
        self.stack.callback(made.delete)
        return made

    def serve(self, ns: Netns) -> None:
        """A TCP server on port 80 of ``ns``, listening before the Pod has any address."""
        cmd = ["ip", "netns", "exec", ns.name, sys.executable, "-u", "-c", SERVER]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        self.stack.callback(proc.stdout.close)
        self.stack.callback(lambda: (proc.kill(), proc.wait()))
        assert proc.stdout.readline().strip() == "ready"

    def table(self) -> str:
        out = self.node.run(["nft", "list", "table", "inet", TABLE], check=False)
        return out.stdout if out.returncode == 0 else ""

    def request_ms(self, cid: str) -> float:
        """pycnid's own time for the ADD of ``cid`` (its "request served" log line)."""
        for line in self.pycnid.log().splitlines():
            if cid in line and '"ADD"' in line and '"ms"' in line:
                return float(json.loads(line[line.index("{") :])["ms"])
        raise AssertionError(f"no ADD of {cid} in pycnid's log")


def pod_args(name: str) -> str:
    return f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}"


def connects(source: Netns, ip: str, timeout: float) -> bool:
    cmd = ["ip", "netns", "exec", source.name, sys.executable, "-c", CONNECT, ip, str(timeout)]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip() == "True"


@pytest.fixture(scope="module")
def kube_node(cni_bin, cni_path) -> Iterator[KubeNode]:
    with ExitStack() as stack:
        node = new_netns("npkube")
        stack.callback(node.delete)
        api = FakeKubeAPI(netns=node.name, host="127.0.0.1", port=6443, tls=True)
        stack.callback(api.close)
        api.start()
        workdir = tempfile.mkdtemp(prefix="pycnid-npkube-")
        stack.callback(shutil.rmtree, workdir, True)
        kubeconfig = api.write_kubeconfig(f"{workdir}/kubeconfig")
        config = daemon_config(
            workdir,
            NODE,
            networkPolicy={"enforce": True},
            kubernetes={"kubeconfig": kubeconfig, "requestTimeout": 2},
            logLevel="info",
        )
        api.put(namespace("default"))
        api.put(network_policy("default", "deny-in", {"matchLabels": {"app": "isolated"}}))
        for name, app in (("client", "client"), ("target", "isolated"), ("open", "open")):
            api.put(pod("default", name, [], NODE, {"app": app}))  # no status.podIPs
        pycnid = Pycnid(node=node, workdir=workdir, config=config).start()
        stack.callback(pycnid.stop)
        made = KubeNode(node, api, pycnid, cni_bin, cni_path, stack)
        wait_for(
            "the first render (the three kinds listed)", lambda: "chain forward" in made.table()
        )
        yield made


def test_a_selected_pod_refuses_a_connection_right_after_its_add(kube_node: KubeNode) -> None:
    client, target, open_ = (kube_node.netns(r) for r in ("npclient", "nptarget", "npopen"))
    kube_node.serve(target)
    kube_node.serve(open_)
    assert kube_node.run("ADD", new_cid(), client.path, pod_args("client")).code == 0
    cid = new_cid()
    added = kube_node.run("ADD", cid, target.path, pod_args("target"))
    assert added.code == 0, added.stdout
    target_ip = ip_of(added.json)
    refused = not connects(client, target_ip, 1.0)  # no sleep: the ADD has returned
    opened = kube_node.run("ADD", new_cid(), open_.path, pod_args("open"))
    assert opened.code == 0, opened.stdout
    assert connects(client, ip_of(opened.json), 2.0)  # unselected: answered at once
    assert refused, "the isolated Pod answered right after its ADD"
    assert target_ip in kube_node.table()
    assert kube_node.run("DEL", cid, target.path, pod_args("target")).code == 0
    wait_for("the table to forget the deleted Pod", lambda: target_ip not in kube_node.table(), 5)


def test_a_restarted_pycnid_keeps_a_new_pod_isolated(kube_node: KubeNode) -> None:
    """The attachment lives in pycnid's memory; started again before kubelet wrote the
    Pod's addresses, pycnid takes it back from pycni-ipam's handle."""
    client, target = (kube_node.netns(r) for r in ("npclient", "nptarget"))
    kube_node.serve(target)
    assert kube_node.run("ADD", new_cid(), client.path, pod_args("client")).code == 0
    cid = new_cid()
    added = kube_node.run("ADD", cid, target.path, pod_args("target"))
    assert added.code == 0, added.stdout
    rendered = kube_node.pycnid.log().count("table rendered")
    kube_node.pycnid.stop()
    kube_node.pycnid.start()
    wait_for(
        "a render by the restarted pycnid",
        lambda: kube_node.pycnid.log().count("table rendered") > rendered,
        timeout=15,
        step=0.05,
    )
    assert not connects(client, ip_of(added.json), 1.0)
    assert kube_node.run("DEL", cid, target.path, pod_args("target")).code == 0


def test_an_add_for_a_pod_the_api_does_not_have_fails_with_11_and_leaves_nothing(
    kube_node: KubeNode,
) -> None:
    ghost = kube_node.netns("npghost")
    before = (node_veths(kube_node.node, NETWORK), masq_elements(kube_node.node, NETWORK))
    handles = ipam_handles(kube_node.pycnid.config["store"]["path"], NETWORK)
    started = time.monotonic()
    out = kube_node.run("ADD", new_cid(), ghost.path, pod_args("ghost"))
    took = time.monotonic() - started
    assert out.error_code() == 11 and "default/ghost" in out.json["msg"], out.stdout
    assert SETTLE <= took < SETTLE + 3, took
    assert (node_veths(kube_node.node, NETWORK), masq_elements(kube_node.node, NETWORK)) == before
    assert ipam_handles(kube_node.pycnid.config["store"]["path"], NETWORK) == handles
    assert ghost.links() == ["lo"]
    bad = kube_node.run("ADD", new_cid(), ghost.path, "K8S_POD_NAMESPACE=default;K8S_POD_NAME=A_")
    assert bad.error_code() == 7 and "K8S_POD_NAME" in bad.json["msg"], bad.stdout


def test_the_add_cost_of_isolating_a_pod(kube_node: KubeNode) -> None:
    """Server-side ms of ADDs that settle (the isolated Pod) and of ADDs that do not (no Pod
    named): the difference is the price of being isolated before the ADD returns."""
    times: dict[str, list[float]] = {"isolating": [], "not": []}
    for _ in range(10):
        for kind, args in (("isolating", pod_args("target")), ("not", "")):
            ns = kube_node.netns("npcost")
            cid = new_cid()
            assert kube_node.run("ADD", cid, ns.path, args).code == 0
            times[kind].append(kube_node.request_ms(cid))
            assert kube_node.run("DEL", cid, ns.path, args).code == 0
    on, off = (statistics.median(times[k]) for k in ("isolating", "not"))
    least = {k: min(v) for k, v in times.items()}
    print(
        f"\nADD in pycnid, {len(times['not'])} each: median isolating {on:.2f} ms, not "
        f"{off:.2f} ms, +{on - off:.2f} ms; least {least['isolating']:.2f} against "
        f"{least['not']:.2f} ms, +{least['isolating'] - least['not']:.2f} ms"
    )

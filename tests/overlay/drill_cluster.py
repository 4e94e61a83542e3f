"""The three-node world of the overlay drills: Pods with roles, a Service, a policy, and traffic
that runs for the whole drill.

Pods (each with the endpoint record pycni-svc would publish, namespace ``drill``): on node1 a
client (app=client) and a denied Pod (app=other), on node2 web-0, on node3 web-1 (app=web) and
a peer; web-0, web-1 and the peer serve TCP echo on 8080 and 9100. The Service drill/web
(80 → 8080) selects app=web; the policy drill/web isolates app=web for ingress and admits
app=client only. Traffic (tests/overlay/probes.py), a new connection each probe: client → peer
(Pod to Pod across nodes), client → drill/web's VIP (through the Service), client → web-0
(under the policy) every 0.1 s; denied → web-1 and denied → the VIP every 0.2 s (never to be
answered).
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from services.record import EndpointRecord
from tests.cluster.load import Call
from tests.fixtures.cluster import EtcdOnUnderlay
from tests.fixtures.plugins import PluginRun
from tests.fixtures.waiting import wait_for

from .pods import NETWORK, OverlayCluster, Pod, pycni_cli, scrape
from .probes import Prober, Window, calc_window, reaches, serve_echo
from .test_services import route_service_cidr

NS = "drill"
ROLES = {  # Pod -> (node index, app label)
    "client": (0, "client"),
    "denied": (0, "other"),
    "web-0": (1, "web"),
    "web-1": (2, "web"),
    "peer": (2, "peer"),
}
ALLOWED = ("pod-pod", "service", "policy")  # the probers' kinds that must be answered
DENIED = ("denied-pod", "denied-svc")  # and those that never may


def web_policy(name: str, ingress: list[dict]) -> dict:
    """A NetworkPolicy manifest on the app=web Pods."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": NS, "name": name},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": ingress},
    }


WEB_POLICY = web_policy("web", [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}]}])


@dataclass
class DrillCluster:
    cluster: OverlayCluster
    workdir: str  # manifests go here
    pods: dict[str, Pod] = field(default_factory=dict)
    vip: str = ""  # drill/web's ClusterIP
    probers: list[Prober] = field(default_factory=list)
    servers: list[subprocess.Popen] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)  # phase -> when it began (monotonic)

    @property
    def etcd(self) -> EtcdOnUnderlay:
        return self.cluster.cluster.etcd

    def cli(self, *args: str) -> dict:
        """`pycni ARGS --output json` on node1, which must succeed."""
        out = pycni_cli(self.cluster.nodes[0], *args, "--output", "json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def manifest(self, doc: dict) -> str:
        """The manifest as a file for `pycni netpol apply -f`."""
        path = f"{self.workdir}/{doc['metadata']['name']}.json"
        with open(path, "w") as fh:
            json.dump(doc, fh)
        return path

    def mark(self, phase: str) -> None:
        self.marks[phase] = time.monotonic()

    def setup(self) -> None:
        """Pods, servers, Service and policy; traffic flowing, the denied pair refused, every
        node holding its outage buffer."""
        self.add_pods()
        for node in self.cluster.nodes:
            route_service_cidr(self.cluster, node)
        self.cli("svc", "config", "set", "--cidr", "10.96.0.0/24")
        web = ("--port", "80/TCP:8080", "--selector", "app=web")
        self.vip = self.cli("svc", "create", f"{NS}/web", *web)["service"]["clusterIPs"][0]
        self.cli("netpol", "apply", "-f", self.manifest(WEB_POLICY))
        denied, web1 = self.pods["denied"], self.pods["web-1"]
        wait_for("denied -> web-1 refused", lambda: not reaches(denied.ns, web1.ip, 8080), 20)
        self.start_traffic()
        self.wait_buffers()

    def add_pods(self) -> None:
        nodes = self.cluster.nodes
        for name, (index, app) in ROLES.items():
            pod = self.pods[name] = self.cluster.add_pod(nodes[index])
            record = EndpointRecord(
                NS, name, "eth0", (pod.ip,), {"app": app}, pod.node.name,
                container_id=pod.container_id, network=NETWORK,
            )  # fmt: skip
            self.etcd.put(record.key, record.to_bytes())
            if app in ("web", "peer"):
                self.servers.append(serve_echo(pod.ns, 8080, 9100))

    def start_traffic(self) -> None:
        client, denied = self.pods["client"].ns, self.pods["denied"].ns
        self.probers = [
            Prober("pod-pod", client, self.pods["peer"].ip, 8080).start(),
            Prober("service", client, self.vip, 80).start(),
            Prober("policy", client, self.pods["web-0"].ip, 8080).start(),
            Prober("denied-pod", denied, self.pods["web-1"].ip, 8080, 0.2, 1.0).start(),
            Prober("denied-svc", denied, self.vip, 80, 0.2, 1.0).start(),
        ]
        for prober in self.probers[: len(ALLOWED)]:
            wait_for(f"{prober.kind} answered", lambda p=prober: any(a for _, a in p.attempts()))

    def wait_buffers(self) -> None:
        """Until every node holds its outage buffer (reserved after its first ADD)."""
        for node in self.cluster.nodes:
            wait_for(
                f"{node.name}'s outage buffer",
                lambda n=node: scrape(n).get('pycni_ipam_outage_buffer_addresses{pool="pods"}'),
                20,
                0.2,
            )

    def windows(self, phases: dict[str, tuple[str, str]]) -> dict[str, dict[str, Window]]:
        """kind -> {phase: what its prober saw from one mark to another}."""
        spans = {p: (self.marks[a], self.marks[b]) for p, (a, b) in phases.items()}
        found = {}
        for prober in self.probers:
            attempts = prober.attempts()
            found[prober.kind] = {p: calc_window(attempts, *s) for p, s in spans.items()}
        return found

    def assert_traffic(self, phases: dict[str, tuple[str, str]]) -> None:
        """In every phase: no probe of the allowed traffic lost, the denied pair never
        answered."""
        found = self.windows(phases)
        lost = {k: w for k in ALLOWED for w in found[k].values() if w.lost}
        let_in = {k: w for k in DENIED for w in found[k].values() if w.answered}
        assert not let_in, f"the denied pair was answered: {let_in}"
        assert not lost, f"allowed traffic lost probes: {lost}"

    def pod_calls(self) -> list[Call]:
        """The setup's Pods as the calls that added them (for the address and handle checks)."""
        return [
            Call(p.node.name, p.container_id, "ADD", PluginRun(0, json.dumps(p.result), ""), 0.0)
            for p in self.pods.values()
        ]

    def assert_reachable(self, live: list[Call]) -> None:
        """Every live Pod answers a ping from another node: node1's from the peer, the others'
        from the client (web-0 and web-1 admit the client only). A Pod that does not is
        reported with where its address is and what the nodes on the path hold for it."""
        client, peer = self.pods["client"], self.pods["peer"]

        def answers(call: Call) -> str:
            src, ip = (peer if call.node == client.node.name else client), call.ips()[0]
            try:
                wait_for(f"{src.ip} -> {ip}", lambda: src.ns.ping(ip, timeout=1), 10, 0.1)
            except AssertionError as timed_out:
                return f"{timed_out} ({call.node}'s Pod {call.cid[:12]})\n{self.describe(ip)}"
            return ""

        with ThreadPoolExecutor(8) as pool:
            unanswered = [found for found in pool.map(answers, live) if found]
        assert not unanswered, "\n".join(unanswered)

    def describe(self, ip: str) -> str:
        """Every namespace of the run that holds ``ip``, and each node's neighbour entry and
        route for it."""
        lines = []
        for host in self.cluster.cluster.underlay.hosts:
            held = host.ns.run(["ip", "-o", "addr", "show", "to", ip], check=False).stdout
            lines += [f"  {host.ns.name} holds: {line}" for line in held.splitlines()]
        for node in self.cluster.nodes:
            ns = node.host.ns
            for what in (["ip", "neigh", "show", "to", ip], ["ip", "route", "get", ip]):
                out = ns.run(what, check=False)
                lines.append(
                    f"  {node.name} {' '.join(what[:2])}: {(out.stdout + out.stderr).strip()}"
                )
        return "\n".join(lines)

    def close(self) -> None:
        for prober in self.probers:
            prober.stop()
        for server in self.servers:
            server.kill()
            server.wait()

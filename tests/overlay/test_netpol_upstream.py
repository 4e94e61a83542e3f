"""The upstream NetworkPolicy e2e cases (tests/fixtures/netpol_e2e.py) with real packets on two
nodes: x, y, z × a, b, c, the Pods alternating between the nodes as the cases' cluster places
them, on the VXLAN overlay, every node's pycnid enforcing. Each case's policies replace the
store's in one etcd transaction; once both nodes' tables hold the case's chains, every cell
(source Pod, destination Pod, protocol, port 80/81) is probed with a real connect and compared
with the e2e's own expectation (not pycni's model): cross-node cells meet egress on the
source's node and ingress on the destination's, same-node cells the bridge.

The cases' addresses (``10.0.0.x``, the pod subnet ``10.0.0.0/24``) are rewritten to the Pods'
real ones and the pool's CIDR. SCTP cells are not probed: this kernel has no ``sctp`` module,
so no SCTP socket opens in any namespace (the model tests check SCTP). The default suite runs
a subset covering every kind of peer, port and direction; `make long` runs all cases.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from netpol.evaluate import NamedPort, PodInfo, PolicyInputs
from netpol.policy import parse_policy
from netpol.render import TABLE, calc_layout
from services.record import EndpointRecord
from store.codec import encode
from store.keys import NETPOLS, namespace_key, netpol_key
from tests.fixtures import netpol_e2e as e2e
from tests.fixtures.cluster import ClusterNode
from tests.fixtures.scale import sized
from tests.fixtures.waiting import wait_for
from tests.netns.netpol_cluster import PROBER, forget_udp_flows

from .pods import OverlayCluster, Pod, python_in

pytestmark = [pytest.mark.netns, pytest.mark.etcd, pytest.mark.slow, pytest.mark.long]

POOL = "10.131.0.0/16"
PORTS = (80, 81)
SERVER = """
import socket, threading
def echo(c):
    with c:
        while (d := c.recv(4096)):
            c.sendall(d)
def tcp(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(512)
    while True:
        c, _ = s.accept(); threading.Thread(target=echo, args=(c,), daemon=True).start()
def udp(port):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", port))
    while True:
        d, a = u.recvfrom(4096); u.sendto(d, a)
for p in (80, 81):
    threading.Thread(target=tcp, args=(p,), daemon=True).start()
    threading.Thread(target=udp, args=(p,), daemon=True).start()
threading.Event().wait()
"""
#: One case per kind the e2e covers (pod/namespace selectors and expressions, both directions,
#: ports numeric and named, ipBlock with except, stacked policies, a policy deleted).
SHORT = (
    "default-deny-all",
    "allow based on PodSelector and NamespaceSelector",
    "allow ingress access on one named port",
    "allow egress access on one named port",
    "except clause while egress access to server in CIDR block",
    "deny egress on the client side even if the server allows it",
    "not allow access by TCP when a policy specifies only UDP",
    "stop enforcing policies after they are deleted",
)
CASES = sized(tuple(c for c in e2e.CASES if c.name in SHORT), e2e.CASES)
Cell = tuple[e2e.Ref, e2e.Ref, str, int]


class Upstream:
    """The two-node cluster with the e2e's nine Pods serving TCP and UDP on 80 and 81."""

    def __init__(self, cluster: OverlayCluster) -> None:
        self.cluster = cluster
        self.pods: dict[e2e.Ref, Pod] = {}
        self.servers: list[subprocess.Popen] = []
        self.model = e2e.cluster(())

    def node_of(self, ref: e2e.Ref) -> ClusterNode:
        """node1 or node2, as the cases' cluster places the Pod (n1, n2)."""
        placed = next(p.node for p in self.model.pods if (p.namespace, p.name) == ref)
        return self.cluster.nodes[int(placed[1:]) - 1]

    def start(self) -> None:
        etcd = self.cluster.cluster.etcd
        for ns in "xyz":
            etcd.put(namespace_key(ns), encode({"labels": {"ns": ns}}))
        for ref in e2e.PODS:
            pod = self.cluster.add_pod(self.node_of(ref))
            self.pods[ref] = pod
            etcd.put(*endpoint_of(ref, pod))
            self.servers.append(subprocess.Popen(python_in(pod.ns, SERVER)))
        self.wait_programmed(())
        first = e2e.PODS[0]
        up = [(first, d, proto, port) for d in e2e.PODS if d != first for proto in ("TCP", "UDP")
              for port in PORTS]  # fmt: skip
        wait_for("the servers", lambda: all(self.probe(up, 1.0).values()), 30)

    def stop(self) -> None:
        for server in self.servers:
            server.kill()
            server.wait()

    def info(self) -> tuple[PodInfo, ...]:
        ports = tuple(NamedPort(n, proto, port) for n, proto, port in e2e.SERVED)
        return tuple(
            PodInfo(ns, name, (pod.ip,), {"pod": name}, pod.node.name, ports)
            for (ns, name), pod in self.pods.items()
        )

    def set_policies(self, manifests: tuple[dict[str, Any], ...]) -> None:
        """The store holds exactly these (their addresses made real); both nodes program them."""
        policies = tuple(parse_policy(self.localised(m)) for m in manifests)
        items = {netpol_key(p.namespace, p.name): encode(p.to_dict()) for p in policies}
        self.cluster.cluster.etcd.replace_prefix(NETPOLS, items)
        self.wait_programmed(policies)

    def localised(self, manifest: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps(manifest).replace('"10.0.0.0/24"', json.dumps(POOL))
        for ref, pod in self.pods.items():
            text = text.replace(f'"{e2e.ip_of(ref)}/', f'"{pod.ip}/')
        return json.loads(text)

    def wait_programmed(self, policies: tuple, timeout: float = 20) -> None:
        inputs = PolicyInputs(self.info(), {n: {"ns": n} for n in "xyz"}, policies)
        for node in self.cluster.nodes:
            expected = {"forward", *calc_layout(inputs, node.name).chains}
            wait_for(
                f"{node.name}'s table to hold chains {sorted(expected)}",
                lambda node=node, expected=expected: chains(node) == expected,
                timeout,
                step=0.05,
            )

    def probe(self, cells: list[Cell], timeout: float) -> dict[Cell, bool]:
        """Every cell at once: one prober per source Pod, a thread per target; the nodes'
        UDP conntrack entries deleted first (``forget_udp_flows``)."""
        for node in self.cluster.nodes:
            forget_udp_flows(node.host.ns)
        by_source: dict[e2e.Ref, list[Cell]] = {}
        for cell in cells:
            by_source.setdefault(cell[0], []).append(cell)
        runs = {
            src: subprocess.Popen(
                [
                    *python_in(self.pods[src].ns, PROBER),
                    json.dumps([(self.pods[c[1]].ip, c[2], c[3]) for c in mine]),
                    str(timeout),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for src, mine in by_source.items()
        }
        found: dict[Cell, bool] = {}
        for src, run in runs.items():
            out, err = run.communicate(timeout=120)
            assert run.returncode == 0, err
            found.update(zip(by_source[src], json.loads(out), strict=True))
        return found


def endpoint_of(ref: e2e.Ref, pod: Pod) -> tuple[str, bytes]:
    """The record pycni-svc would publish for the Pod (labels pod=<name>, the named ports)."""
    record = EndpointRecord(
        ref[0],
        ref[1],
        "eth0",
        (pod.ip,),
        {"pod": ref[1]},
        pod.node.name,
        {n: port for n, _proto, port in e2e.SERVED},
        pod.container_id,
        "overlaynet",
        port_protocols={n: proto for n, proto, _port in e2e.SERVED if proto != "TCP"},
    )
    return record.key, record.to_bytes()


def chains(node: ClusterNode) -> set[str]:
    out = node.host.ns.run(["nft", "-j", "-t", "list", "table", "inet", TABLE], check=False)
    if out.returncode != 0:
        return set()
    return {o["chain"]["name"] for o in json.loads(out.stdout)["nftables"] if "chain" in o}


@pytest.fixture(scope="module")
def upstream(module_overlay) -> Iterator[Upstream]:
    cluster = module_overlay(
        "vxlan", nodes=2, cidr=POOL, daemon={"networkPolicy": {"enforce": True}}
    )
    made = Upstream(cluster)
    try:
        made.start()
        yield made
    finally:
        made.stop()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_upstream_case_on_two_nodes(upstream: Upstream, case: e2e.Case) -> None:
    upstream.set_policies(case.policies)
    protocols = [p for p in case.protocols if p != "SCTP"]
    cells = [
        (s, d, proto, port)
        for s in e2e.PODS
        for d in e2e.PODS
        if s != d
        for proto in protocols
        for port in PORTS
    ]
    found = upstream.probe(cells, 1.0)
    retry = [c for c, ok in found.items() if case.expect(*c) and not ok]
    if retry:  # a slow first packet is no denial
        found.update(upstream.probe(retry, 3.0))
    wrong = sorted(
        f"{s[0]}/{s[1]} ({upstream.node_of(s).name}) -> {d[0]}/{d[1]} "
        f"({upstream.node_of(d).name}) {proto}/{port}: got {ok}, e2e expects {not ok}"
        for (s, d, proto, port), ok in found.items()
        if ok != case.expect(s, d, proto, port)
    )
    assert not wrong, "\n".join(wrong[:20])

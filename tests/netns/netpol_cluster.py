"""One node of the upstream NetworkPolicy e2e shape (kubernetes test/e2e/network/netpol):
namespaces x, y, z with Pods a, b, c each, dual-stack (10.22.0.0/24, fd22::/64), attached by
pycni-bridge to a real pycnid that enforces NetworkPolicy; every Pod serves TCP 80 and 81 and
UDP 80 on both families (echo). Namespace and Pod
labels are store records (``ns: <name>``, ``pod: <name>``), as pycni-svc and the CLI write
them. ``probe_matrix`` connects every Pod to every Pod on every port at once (one prober
process per source, a thread per target, short timeouts) and ``expected_matrix`` asks
``netpol.evaluate`` (the model) for the same cells.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from netpol.evaluate import NamedPort, PodInfo, PolicyInputs, evaluate
from netpol.policy import NetworkPolicy, parse_policy
from netpol.render import TABLE, calc_layout
from services.record import EndpointRecord
from store.base import Delete, Put
from store.codec import encode
from store.keys import NETPOLS, namespace_key, netpol_key
from store.sqlite import SqliteStore
from tests.fixtures.bridge import bridge_conf, ip_of, new_cid
from tests.fixtures.daemon import SCRAPE, Pycnid, daemon_config, parse_samples
from tests.fixtures.netns import Netns, new_netns
from tests.fixtures.plugins import run_plugin
from tests.fixtures.waiting import wait_for

NODE = "node1"
NAMESPACES = ("x", "y", "z")
PODS = ("a", "b", "c")
PORTS = (("TCP", 80), ("TCP", 81), ("UDP", 80))
NAMED = {"serve-80-tcp": ("TCP", 80), "serve-81-tcp": ("TCP", 81), "serve-80-udp": ("UDP", 80)}
METRICS = "127.0.0.1:9464"
SERVER = """
import socket, threading
def dual(kind):
    s = socket.socket(socket.AF_INET6, kind)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0); return s
def echo(c):
    with c:
        while (d := c.recv(4096)):
            c.sendall(d)
def tcp(port):
    s = dual(socket.SOCK_STREAM); s.bind(("::", port)); s.listen(512)
    while True:
        c, _ = s.accept(); threading.Thread(target=echo, args=(c,), daemon=True).start()
for p in (80, 81):
    threading.Thread(target=tcp, args=(p,), daemon=True).start()
u = dual(socket.SOCK_DGRAM); u.bind(("::", 80))
while True:
    d, a = u.recvfrom(4096); u.sendto(d, a)
"""
PROBER = """
import json, socket, sys, threading
targets, timeout = json.loads(sys.argv[1]), float(sys.argv[2])
out = [False] * len(targets)
def probe(i, ip, proto, port):
    try:
        if proto == "TCP":
            with socket.create_connection((ip, port), timeout=timeout) as s:
                s.sendall(b"x"); out[i] = s.recv(1) == b"x"
        else:
            family = socket.AF_INET6 if ":" in ip else socket.AF_INET
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.settimeout(timeout); s.sendto(b"x", (ip, port)); out[i] = s.recv(1) == b"x"
    except OSError:
        out[i] = False
threads = [threading.Thread(target=probe, args=(i, *t)) for i, t in enumerate(targets)]
[t.start() for t in threads]; [t.join() for t in threads]
print(json.dumps(out))
"""
Cell = tuple[str, str, str, int, int]  # source ref, destination ref, protocol, port, family
IPAM = {
    "type": "pycni-ipam",
    "ranges": [[{"subnet": "10.22.0.0/24"}], [{"subnet": "fd22::/64"}]],
    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
}


@dataclass
class Pod:
    namespace: str
    name: str
    ns: Netns
    ips: tuple[str, str]  # IPv4, IPv6
    server: subprocess.Popen | None = None

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def ip(self) -> str:
        return self.ips[0]

    def address(self, family: int) -> str:
        return self.ips[0 if family == 4 else 1]


@dataclass
class NetpolNode:
    node: Netns
    pycnid: Pycnid
    store: SqliteStore
    cni_bin: str
    cni_path: str
    pods: dict[str, Pod] = field(default_factory=dict)

    def exe(self, plugin: str) -> str:
        return os.path.join(self.cni_bin, plugin)

    def restart(self, **section: Any) -> None:
        """pycnid again, its ``networkPolicy`` section ``{"enforce": true, **section}`` (the
        table stays in the kernel meanwhile)."""
        self.pycnid.stop()
        self.pycnid.config["networkPolicy"] = {"enforce": True, **section}
        self.pycnid.start()

    def info(self) -> tuple[PodInfo, ...]:
        ports = tuple(NamedPort(n, proto, port) for n, (proto, port) in NAMED.items())
        return tuple(
            PodInfo(p.namespace, p.name, p.ips, {"pod": p.name}, NODE, ports)
            for p in self.pods.values()
        )

    def inputs(self, policies: tuple[NetworkPolicy, ...]) -> PolicyInputs:
        return PolicyInputs(self.info(), {n: {"ns": n} for n in NAMESPACES}, policies)

    def set_policies(self, *manifests: dict[str, Any]) -> tuple[NetworkPolicy, ...]:
        """The store holds exactly these policies; returns once the kernel holds their
        chains (the chain names the render gives them)."""
        policies = tuple(parse_policy(m) for m in manifests)
        wanted = {netpol_key(p.namespace, p.name): p for p in policies}
        gone = [kv.key for kv in self.store.range(NETPOLS, keys_only=True) if kv.key not in wanted]
        puts = [Put(k, encode(p.to_dict())) for k, p in wanted.items()]
        self.store.txn([], [*puts, *(Delete(k) for k in gone)])
        self.wait_programmed(policies)
        return policies

    def wait_programmed(self, policies: tuple[NetworkPolicy, ...], timeout: float = 15) -> None:
        expected = {"forward", *calc_layout(self.inputs(policies), NODE).chains}
        try:
            wait_for(
                f"the table to hold chains {sorted(expected)}",
                lambda: self.chains() == expected,
                timeout,
                step=0.02,
            )
        except AssertionError:
            log = self.pycnid.log()
            raise AssertionError(f"{log[-3000:]}\n(pycnid's log, last lines)") from None

    def chains(self) -> set[str]:
        out = self.node.run(["nft", "-j", "-t", "list", "table", "inet", TABLE], check=False)
        if out.returncode != 0:
            return set()
        doc = json.loads(out.stdout)
        return {o["chain"]["name"] for o in doc["nftables"] if "chain" in o}

    def drop_counters(self) -> dict[str, int]:
        """Packets of every per-Pod drop counter of the table (``dropped-in/<ns>/<pod>``,
        ``dropped-eg/<ns>/<pod>``); a Pod isolated in no direction has none."""
        out = self.node.run(["nft", "-j", "list", "counters", "table", "inet", TABLE])
        return {
            o["counter"]["name"]: int(o["counter"]["packets"])
            for o in json.loads(out.stdout)["nftables"]
            if "counter" in o and o["counter"]["name"].startswith("dropped-")
        }

    def probe(self, source: Pod, targets: list[tuple[str, str, int]], timeout: float) -> list:
        cmd = ["ip", "netns", "exec", source.ns.name, sys.executable, "-c", PROBER]
        out = subprocess.run(
            [*cmd, json.dumps(targets), str(timeout)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def probe_matrix(self, cells: list[Cell], timeout: float = 1.0) -> dict[Cell, bool]:
        forget_udp_flows(self.node)
        by_source: dict[str, list[Cell]] = {}
        for cell in cells:
            by_source.setdefault(cell[0], []).append(cell)
        found: dict[Cell, bool] = {}
        with ThreadPoolExecutor(len(by_source)) as pool:
            runs = {
                src: pool.submit(
                    self.probe,
                    self.pods[src],
                    [(self.pods[c[1]].address(c[4]), c[2], c[3]) for c in mine],
                    timeout,
                )
                for src, mine in by_source.items()
            }
            for src, run in runs.items():
                found.update(zip(by_source[src], run.result(), strict=True))
        return found

    def all_cells(self, families: tuple[int, ...] = (4,)) -> list[Cell]:
        return [
            (s, d, proto, port, family)
            for s in self.pods
            for d in self.pods
            for proto, port in PORTS
            for family in families
        ]

    def expected_matrix(self, policies: tuple[NetworkPolicy, ...], cells: list[Cell]) -> dict:
        inputs = self.inputs(policies)
        return {
            (src, dst, proto, port, family): evaluate(
                inputs,
                self.pods[src].address(family),
                self.pods[dst].address(family),
                proto,
                port,
            ).allowed
            for src, dst, proto, port, family in cells
        }

    def check_matrix(
        self, policies: tuple[NetworkPolicy, ...], families: tuple[int, ...] = (4,)
    ) -> dict[Cell, bool]:
        """Real connects of every cell against the model; a cell that failed where the model
        allows it is tried again with a longer timeout (a slow first packet is no denial)."""
        cells = self.all_cells(families)
        expected = self.expected_matrix(policies, cells)
        found = self.probe_matrix(cells)
        retry = [c for c, ok in found.items() if expected[c] and not ok]
        if retry:
            found.update(self.probe_matrix(retry, timeout=3.0))
        wrong = {c: ok for c, ok in found.items() if ok != expected[c]}
        assert not wrong, f"kernel != model (cell: kernel's answer): {wrong}"
        return found

    def close(self) -> None:
        for pod in self.pods.values():
            if pod.server is not None:
                pod.server.kill()
                pod.server.wait()
            pod.ns.delete()
        self.store.close()
        self.pycnid.stop()
        self.node.delete()
        shutil.rmtree(self.pycnid.workdir, ignore_errors=True)


def forget_udp_flows(node: Netns) -> None:
    """Delete the node's UDP conntrack entries: a probe's socket takes a random source port,
    and one that an earlier allowed probe of the same pair used within conntrack's 30 s is
    that flow again, accepted as established (existing flows are kept by design), not judged
    as the new connection the cell is about."""
    node.run(["conntrack", "-D", "-p", "udp"], check=False)


def make_node(cni_bin: str, cni_path: str) -> NetpolNode:
    node = new_netns("npnode")
    workdir = tempfile.mkdtemp(prefix="pycnid-netpol-")
    config = daemon_config(workdir, NODE, metricsAddress=METRICS, networkPolicy={"enforce": True})
    pycnid = Pycnid(node=node, workdir=workdir, config=config)
    made = NetpolNode(node, pycnid, SqliteStore(config["store"]["path"]), cni_bin, cni_path)
    try:
        pycnid.start()
        for namespace in NAMESPACES:
            made.store.txn(
                [], [Put(namespace_key(namespace), encode({"labels": {"ns": namespace}}))]
            )
            for name in PODS:
                made.pods[f"{namespace}/{name}"] = add_pod(made, namespace, name)
        for pod in made.pods.values():
            pod.server = subprocess.Popen(
                ["ip", "netns", "exec", pod.ns.name, sys.executable, "-c", SERVER]
            )
        made.wait_programmed(())
        wait_for("the servers", lambda: all(made.probe_matrix(servers_up(made), 1.0).values()), 20)
    except BaseException:
        made.close()
        raise
    return made


def servers_up(node: NetpolNode) -> list[Cell]:
    first = next(iter(node.pods))
    return [(first, d, proto, port, f) for d in node.pods for proto, port in PORTS for f in (4, 6)]


def add_pod(node: NetpolNode, namespace: str, name: str) -> Pod:
    ns = new_netns("nppod")
    cid = new_cid()
    res = run_plugin(
        node.exe("pycni-bridge"),
        "ADD",
        bridge_conf(IPAM, isDefaultGateway=True),
        container_id=cid,
        netns=ns.path,
        cni_path=node.cni_path,
        socket=node.pycnid.socket,
        args=f"K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}",
    )
    assert res.code == 0, f"ADD failed: {res.stdout} {res.stderr}"
    ips = (ip_of(res.json, 0), ip_of(res.json, 1))
    record = EndpointRecord(
        namespace,
        name,
        "eth0",
        ips,
        {"pod": name},
        NODE,
        {n: port for n, (_proto, port) in NAMED.items()},
        cid,
        "podnet",
        port_protocols={n: proto for n, (proto, _port) in NAMED.items() if proto != "TCP"},
    )
    node.store.txn([], [Put(record.key, record.to_bytes())])
    return Pod(namespace, name, ns, ips)


def scrape(node: Netns) -> dict[str, float]:
    return parse_samples(node.run([sys.executable, "-c", SCRAPE % METRICS]).stdout)


def policy(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"podSelector": {}, **spec},
    }


def elapsed(since: float) -> float:
    return time.monotonic() - since

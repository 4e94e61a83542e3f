"""The load of `make soak`: Pod churn, Service and policy changes, traffic, and their tally.

Each worker is a loop on its own thread that runs until ``stop`` is set and records what it
did in one shared ``Tally``: ADD durations (stamped, for the per-minute p99), ADD/DEL counts,
and every error by its first line. Nothing is injected, so every error counts. A worker that
raises records the exception and carries on: a soak that stops churning would measure nothing.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from services.record import EndpointRecord
from tests.fixtures.bridge import ip_of, new_cid
from tests.fixtures.cluster import ClusterNode, Host, b64
from tests.fixtures.netns import Netns, new_netns
from tests.overlay.pods import NETWORK, OverlayCluster, pod_conf, pycni_cli, python_in

CHURN_NS = "soak"  # the namespace of churned Pods, Services and policies
STABLE_NS = "stable"  # the one long-lived Pod a node and the Service in front of them
STABLE_VIP = "10.96.0.10"
SVC_CIDR = "10.96.0.0/16"
KEEP = 3  # churned Services (and policies) alive at once: the oldest goes past that
SETTLED = 2.0  # seconds a Pod lives before traffic is sent to it (peers' routes follow within a
# second of the registry change: tests/overlay/test_churn.py)
# hairpin mode, as the README's conflist and tests/overlay/svc_helpers.py set it: with
# br_netfilter loaded a Pod reaching its own Service through the ClusterIP needs it
POD_CONF = pod_conf(hairpinMode=True)
CONNECT = """
import socket, sys
with socket.create_connection(({ip!r}, 80), timeout=3) as s:
    sys.exit(0 if s.recv(64) else 1)
"""


@dataclass
class Tally:
    """What the workers did; every method may be called from any thread."""

    started: float = field(default_factory=time.monotonic)
    adds: list[tuple[float, float]] = field(default_factory=list)  # (since start, seconds)
    counts: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def add_done(self, seconds: float) -> None:
        with self.lock:
            self.adds.append((time.monotonic() - self.started, seconds))
            self.counts["ADD"] += 1

    def error(self, what: str, detail: str) -> None:
        # its last line, long enough for what a missed ping found the nodes holding
        first = (detail.strip().splitlines() or [""])[-1][:700]
        with self.lock:
            self.errors[f"{what}: {first}"] += 1


@dataclass
class LivePod:
    ns: Netns
    node: ClusterNode
    container_id: str
    ip: str
    born: float
    record: EndpointRecord
    busy: threading.Lock = field(default_factory=threading.Lock)  # held by traffic to it


@dataclass
class Soak:
    """The cluster under load and what lives on it now."""

    built: OverlayCluster
    tally: Tally
    workdir: str
    stop: threading.Event = field(default_factory=threading.Event)
    live: list[LivePod] = field(default_factory=list)
    stable: list[LivePod] = field(default_factory=list)
    names: itertools.count = field(default_factory=lambda: itertools.count(1))

    def loop(self, what: str, every: Callable[[], float], step: Callable[[], None]) -> None:
        """``step`` until stopped, ``every()`` seconds apart; an exception is an error."""
        while not self.stop.is_set():
            try:
                step()
            except Exception as exc:  # noqa: BLE001 -- counted and printed, the soak goes on
                self.tally.error(what, f"{type(exc).__name__}: {exc}")
            self.stop.wait(every())


# --- Pods ----------------------------------------------------------------------------------
def add_pod(soak: Soak, node: ClusterNode, labels: dict[str, str], ns: str) -> LivePod | None:
    """ADD through pycni-bridge + pycni-ipam into a fresh namespace, timed, then the Pod's
    endpoint record (as pycni-svc writes it); None after a failed ADD (counted)."""
    pod_ns = new_netns(f"{node.name}s")
    soak.built.cluster.underlay.hosts.append(Host(pod_ns, ""))  # removed with the underlay
    cid, started = new_cid(), time.monotonic()
    res = soak.built.runner(node).run("ADD", POD_CONF, cid, pod_ns.path)
    if res.code != 0:
        soak.tally.error("ADD", res.stdout + res.stderr)
        drop_namespace(soak, pod_ns)
        return None
    soak.tally.add_done(time.monotonic() - started)
    ip = ip_of(res.json)
    name = f"p{next(soak.names)}"
    record = EndpointRecord(ns, name, "eth0", (ip,), labels, node.name, {}, cid, NETWORK)
    soak.built.cluster.etcd.put(record.key, record.to_bytes())
    return LivePod(pod_ns, node, cid, ip, time.monotonic(), record)


def del_pod(soak: Soak, pod: LivePod) -> None:
    """Endpoint record out, DEL, the namespace gone (a failed DEL is counted)."""
    soak.built.cluster.etcd.call("/v3/kv/deleterange", {"key": b64(pod.record.key)})
    res = soak.built.runner(pod.node).run("DEL", POD_CONF, pod.container_id, pod.ns.path)
    if res.code != 0:
        soak.tally.error("DEL", res.stdout + res.stderr)
    else:
        soak.tally.count("DEL")
    drop_namespace(soak, pod.ns)


def drop_namespace(soak: Soak, ns: Netns) -> None:
    ns.delete()
    hosts = soak.built.cluster.underlay.hosts
    hosts[:] = [h for h in hosts if h.ns is not ns]


def churn_once(soak: Soak, node: ClusterNode, hold: tuple[float, float]) -> None:
    """One Pod's life on ``node``: ADD, live ``hold`` seconds (at random), DEL."""
    labels = {"app": "soak", "gen": str(random.randrange(3))}
    pod = add_pod(soak, node, labels, CHURN_NS)
    if pod is None:
        return
    soak.live.append(pod)
    soak.stop.wait(random.uniform(*hold))
    with pod.busy:
        soak.live.remove(pod)
    del_pod(soak, pod)


# --- Services and policies -----------------------------------------------------------------
def cli(soak: Soak, what: str, *args: str) -> None:
    """`pycni ARGS` on a random node; a failure is an error."""
    out = pycni_cli(random.choice(soak.built.nodes), *args)
    if out.returncode != 0:
        soak.tally.error(what, out.stdout + out.stderr)
    else:
        soak.tally.count(what)


def policy_manifest(name: str, gen: int) -> dict:
    """Isolates the churned Pods of one generation, letting in every Pod of every namespace
    (the traffic's pings still pass: what changes is the ruleset, not the verdict)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": CHURN_NS},
        "spec": {
            "podSelector": {"matchLabels": {"app": "soak", "gen": str(gen)}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"namespaceSelector": {}}]}],
        },
    }


def change_once(soak: Soak, serial: int) -> None:
    """Serial n: Service ``churn<n>`` created and policy ``pol<n>`` applied; those of n-KEEP
    removed."""
    vip = f"10.96.{1 + serial // 250}.{1 + serial % 250}"
    name, port = f"{CHURN_NS}/churn{serial}", "80/TCP:8080"
    cli(
        soak,
        "svc create",
        "svc",
        "create",
        name,
        "--cluster-ip",
        vip,
        "--port",
        port,
        "--selector",
        "app=soak",
    )
    path = os.path.join(soak.workdir, f"pol{serial}.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(policy_manifest(f"pol{serial}", serial % 3), fh)
    cli(soak, "netpol apply", "netpol", "apply", "-f", path)
    if serial >= KEEP:
        cli(soak, "svc rm", "svc", "rm", f"{CHURN_NS}/churn{serial - KEEP}")
        cli(soak, "netpol rm", "netpol", "rm", f"{CHURN_NS}/pol{serial - KEEP}")


# --- traffic -------------------------------------------------------------------------------
def ping_once(soak: Soak) -> None:
    """A stable Pod pings a settled Pod on another node (held against its DEL meanwhile)."""
    src = random.choice(soak.stable)
    settled = time.monotonic() - SETTLED
    targets = [p for p in soak.live + soak.stable if p.node is not src.node and p.born < settled]
    dst = random.choice(targets) if targets else None
    if dst is None or not dst.busy.acquire(blocking=False):
        return
    try:
        if dst in soak.live or dst in soak.stable:
            ok = src.ns.ping(dst.ip, timeout=2)
            record_probe(soak, "ping", ok, "" if ok else ping_miss(src, dst))
    finally:
        dst.busy.release()


def ping_miss(src: LivePod, dst: LivePod) -> str:
    """What a missed ping reports: the pair, and whether a second ping is answered (one lost
    packet, or a Pod not reachable); when not, what the nodes held then (``held_for``)."""
    again = src.ns.ping(dst.ip, timeout=2)
    pair = f"{src.ip} ({src.node.name}) -> {dst.ip} ({dst.node.name})"
    if again:
        return f"{pair}, a second ping answered"
    return f"{pair}, a second ping not answered either ({held_for(src, dst)})"


def held_for(src: LivePod, dst: LivePod) -> str:
    """The destination's age, the routes between the two nodes (with the destination node's
    own addresses: a gateway that is none of them leads elsewhere), and the packets the
    destination's NetworkPolicy drop counter holds: a miss says where it was lost."""
    counter = f"dropped-in/{dst.record.namespace}/{dst.record.pod}"
    listed = dst.node.host.ns.run(
        ["nft", "-j", "list", "counter", "inet", "pycni-netpol", counter], check=False
    )
    packets = re.search(r'"packets":\s*(\d+)', listed.stdout)
    return (
        f"{time.monotonic() - dst.born:.1f} s old; route on {src.node.name}: "
        f"{route_to(src.node, dst.ip)} ({dst.node.name}'s own addresses: "
        f"{own_addresses(dst.node)}); back on {dst.node.name}: {route_to(dst.node, src.ip)}; "
        f"its drop counter: {packets.group(1) if packets else 'none'}; "
        f"{dst.node.name}'s neighbour: {neighbour_of(dst.node, dst.ip)}, the Pod's MAC: "
        f"{pod_mac(dst)}"
    )


def neighbour_of(node: ClusterNode, ip: str) -> str:
    """The node's neighbour entry for ``ip`` (a MAC that is not the Pod's own sends its
    packets nowhere: an address reused before the entry was renewed)."""
    out = node.host.ns.run(["ip", "neigh", "show", "to", ip], check=False)
    return " ".join(out.stdout.split()) or "none"


def pod_mac(pod: LivePod) -> str:
    out = pod.ns.run(["cat", "/sys/class/net/eth0/address"], check=False)
    return out.stdout.strip() or out.stderr.strip()


def route_to(node: ClusterNode, ip: str) -> str:
    """The node's route to ``ip`` (its first words), or why there is none."""
    out = node.host.ns.run(["ip", "-o", "route", "get", ip], check=False)
    return " ".join(out.stdout.split()[:5]) or out.stderr.strip()


def own_addresses(node: ClusterNode) -> str:
    """A node's global IPv4 addresses (a route's gateway that is none of the destination
    node's says the route leads elsewhere)."""
    out = node.host.ns.run(["ip", "-o", "-4", "addr", "show", "scope", "global"], check=False)
    return " ".join(f.split("/")[0] for line in out.stdout.splitlines() for f in line.split()[3:4])


def connect_once(soak: Soak) -> None:
    """A stable Pod connects to the stable Service's ClusterIP (the proxy's DNAT)."""
    src = random.choice(soak.stable)
    out = subprocess.run(
        python_in(src.ns, CONNECT.format(ip=STABLE_VIP)), capture_output=True, timeout=10
    )
    why = (out.stderr.decode(errors="replace").strip().splitlines() or [""])[-1]
    record_probe(soak, "connect", out.returncode == 0, f"{src.ip} -> {STABLE_VIP}:80 {why}")


def record_probe(soak: Soak, what: str, ok: bool, pair: str) -> None:
    if ok:
        soak.tally.count(what)
    else:
        soak.tally.error(what, f"failed {pair}")

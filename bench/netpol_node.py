"""Figures (d), (e) and (f) of `make bench-netpol`: one pycnid node with the synthetic records.

One node namespace, pycnid on a SQLite store that holds the synthetic records
(bench/netpol_records.py, this node the measured one) before it starts, once with
``"networkPolicy": {"enforce": true}`` and once without (the same store: the anchor is the
same pycnid without enforcement). Pods are attached as the tests attach them
(tests/netns/test_netpol_enforce.py): pycni-bridge then pycni-svc, as in a conflist, labels in
``args.cni.labels``. pycnid runs without enforcement first (the first-packet Pods are added
then), then with it.

- (f) VmRSS of pycnid, programmed and settled, enforcing vs not;
- (d) ADD cost: bridge + svc ADD of a Pod in ``ns0`` labelled ``app: a0`` (selected by
  policy ``np0``, so each ADD isolates its Pod before it returns), enforcing vs not, in
  ``--adds`` pairs. The anchor is a second node, the same pycnid and records without
  enforcement, started beside the enforcing one; the ADDs go to the two in turn (which one
  first alternates), a pause after each, once both pycnids are idle (``driver.wait_idle``: a
  pycnid just started enforcing is still busy for a second or more), and the pair's Pods are
  deleted after it (each ADD meets the node's own Pods, not the pairs' before it). Timed one
  phase after the other, the machine's speed drifted between them by more than the figure
  (medians 33-47 ms for the same ADDs); in pairs, each ADD is compared with its neighbour.
  A pair's difference still moves by ~5 ms (sd; the executables' start, ~40 ms of Python
  each ADD), so its median over 60 pairs moved by ~1 ms: hence 150. Beside it, the pairs'
  difference in pycnid's own time serving the two requests (its log's ``ms``). An ADD that
  fails (code 11: no pass programmed its Pod within pycni-svc's wait,
  ``netpol.sync.SETTLE``) is counted with its message, not retried;
- (e) first packet: a client, a server and its twin Pod on the node's bridge, policy
  ``fp/allow`` letting the client reach the server's TCP 8080 (no policy selects the twin);
  ``--connects`` TCP connects to each server, in turn from one client process (each a new
  connection, so each first packet meets the forward hook), with every policy in the store,
  with none (the store's policies deleted: the table stays, nothing isolated), and, as the
  anchor, with none in pycni but the same policies loaded as a linear ruleset
  (bench/netpol_linear.py); the three states in turn, ``--rounds`` times (the order reversed
  every other round). The figure: the p50 of each server connect minus the twin's beside it,
  with every policy minus with none (``measure_first_packet`` says why).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from netpol.policy import parse_policy
from netpol.render import TABLE
from store.base import Delete, Put
from store.keys import NETPOLS
from store.sqlite import SqliteStore
from tests.fixtures.bridge import bridge_conf, ip_of, new_cid
from tests.fixtures.daemon import Pycnid, daemon_config
from tests.fixtures.netns import Netns
from tests.fixtures.plugins import run_plugin

from . import netpol_linear as linear
from . import netpol_records as records
from .common import REFERENCE_BIN, Sandbox, median, percentile, vm_rss_kib
from .driver import wait_idle

IPAM = {"type": "pycni-ipam", "ranges": [[{"subnet": "10.30.0.0/24"}]]}
#: A pass that applied the table, whole or as a difference (``netpol/sync.py``'s log line).
RENDERED = re.compile(r"netpol: table (?:rendered|updated): (\d+) policies")
FP_NS = "fp"
FP_PORT = 8080
SERVER = f"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {FP_PORT})); s.listen(4096)
while True:
    c, _ = s.accept(); c.close()
"""
CLIENT = """
import json, socket, struct, sys, time
ips, port, n = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
linger = struct.pack("ii", 1, 0)  # close with RST: no TIME_WAIT piling up
out = [[] for _ in ips]
for i in range(n):  # the servers in turn, which one first alternating
    for k in (range(len(ips)) if i % 2 == 0 else range(len(ips) - 1, -1, -1)):
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        t = time.perf_counter(); s.connect((ips[k], port)); out[k].append(time.perf_counter() - t)
        s.close()
print(json.dumps(out))
"""


class AddFailed(RuntimeError):
    """pycni-svc's ADD failed (code 11: no pass programmed the Pod within its wait)."""


@dataclass
class PolicyNode:
    box: Sandbox
    cni_bin: str
    netns: Netns
    pycnid: Pycnid
    sizes: records.Sizes
    pids: list[int] = field(default_factory=list)  # every pycnid started (residue checks)

    @property
    def store_path(self) -> str:
        return str(self.pycnid.config["store"]["path"])

    def restart(self, enforce: bool, expected: int | None, timeout: float) -> float | None:
        """pycnid again, enforcing or not; seconds until it rendered ``expected`` policies."""
        self.pycnid.stop()
        self.pycnid.config.pop("networkPolicy", None)
        if enforce:
            self.pycnid.config["networkPolicy"] = {"enforce": True, "resyncInterval": 3600}
        offset = len(self.pycnid.log())
        started = time.monotonic()
        self.pycnid.start(timeout=60)
        if self.pycnid.proc is not None:
            self.box.processes.append(self.pycnid.proc)
            self.pids.append(self.pycnid.proc.pid)
        if expected is None:
            return None
        return wait_rendered(self.pycnid, offset, expected, started, timeout)

    def rss_kib(self, settle: float) -> int | None:
        time.sleep(settle)
        return vm_rss_kib(self.pycnid.proc.pid) if self.pycnid.proc else None

    def plugin(self, plugin: str, command: str, conf: dict, pod: str, cid: str, args: str) -> Any:
        return run_plugin(
            f"{self.cni_bin}/{plugin}",
            command,
            conf,
            container_id=cid,
            netns=pod,
            args=args,
            cni_path=f"{self.cni_bin}:{REFERENCE_BIN}",
            socket=self.pycnid.socket,
        )

    def add(
        self, pod: str, namespace: str, name: str, labels: dict[str, str], cid: str = ""
    ) -> tuple:
        """bridge + svc ADD as a conflist runs them: (seconds, IPv4, undo (DELs))."""
        cid, args = cid or new_cid(), f"K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"
        started = time.perf_counter()
        added = self.plugin("pycni-bridge", "ADD", bridge_conf(IPAM), pod, cid, args)
        if added.code != 0:
            raise RuntimeError(f"pycni-bridge ADD: {added.stdout} {added.stderr}")
        svc_conf = svc_config(added.json, labels)
        svc = self.plugin("pycni-svc", "ADD", svc_conf, pod, cid, args)
        took = time.perf_counter() - started
        if svc.code != 0:
            self.plugin("pycni-bridge", "DEL", bridge_conf(IPAM), pod, cid, args)
            raise AddFailed(f"code {error_code(svc.stdout)} after {took:.2f} s")

        def undo() -> None:
            self.plugin("pycni-svc", "DEL", svc_conf, pod, cid, args)
            self.plugin("pycni-bridge", "DEL", bridge_conf(IPAM), pod, cid, args)

        return took, ip_of(added.json), undo

    def has_counter(self, name: str) -> bool:
        out = self.netns.run(["nft", "list", "counter", "inet", TABLE, name], check=False)
        return out.returncode == 0


def error_code(stdout: str) -> object:
    """The CNI error code of a failed plugin's answer (``?`` if it is not one)."""
    try:
        return json.loads(stdout).get("code", "?")
    except (ValueError, AttributeError):
        return "?"


def svc_config(prev: dict, labels: dict[str, str]) -> dict:
    return {
        "cniVersion": "1.1.0",
        "name": "podnet",
        "type": "pycni-svc",
        "args": {"cni": {"labels": [{"key": k, "value": v} for k, v in labels.items()]}},
        "prevResult": prev,
    }


def wait_rendered(
    pycnid: Pycnid, offset: int, expected: int, started: float, timeout: float
) -> float | None:
    while time.monotonic() - started < timeout:
        if any(int(m[1]) >= expected for m in RENDERED.finditer(pycnid.log()[offset:])):
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def wait_until(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def make_node(
    box: Sandbox, cni_bin: str, sizes: records.Sizes, name: str = "np-node"
) -> PolicyNode:
    """The node namespace and pycnid's config, the records in its store (not started)."""
    netns = Netns(box.netns(name))
    workdir = f"{box.workdir}/{name}"
    config = daemon_config(workdir, sizes.node, logLevel="info", faultInjection=False)
    os.makedirs(workdir, exist_ok=True)
    store = SqliteStore(config["store"]["path"])
    records.write_records(store, records.iter_records(sizes))
    store.close()
    return PolicyNode(
        box, cni_bin, netns, Pycnid(node=netns, workdir=workdir, config=config), sizes
    )


# --- (d) ADD cost --------------------------------------------------------------------------
#: after each timed ADD, and after a pair's DELs: the pass it woke (enforcing) ends before the
#: next ADD starts
ADD_PAUSE = 0.1


def measure_adds(on: PolicyNode, off: PolicyNode, count: int, undo: list) -> dict[str, dict]:
    """``count`` pairs: a Pod in ns0 with ``app: a0`` added to each node in turn, the
    enforcing one first in even pairs, then both deleted (so each ADD meets the node's
    ~``--local`` Pods, not those of the pairs before it). Per side: the seconds of each ADD
    that succeeded (None where it failed, so that the pairs stay paired), why the others
    failed, and the milliseconds pycnid's log says it took to serve each ADD's two requests
    (bridge + svc, and svc alone; None where it has no line)."""
    out: dict[str, dict] = {tag: {"seconds": [], "failed": [], "ids": []} for tag in ("on", "off")}
    for i in range(count):
        sides = [("on", on), ("off", off)]
        mark = len(undo)
        for tag, node in sides if i % 2 == 0 else sides[::-1]:
            took, cid = add_one(node, f"add{tag}{i}", out[tag]["failed"], undo)
            out[tag]["seconds"].append(took)
            out[tag]["ids"].append(cid)
            time.sleep(ADD_PAUSE)
        while len(undo) > mark:
            undo.pop()()
        time.sleep(ADD_PAUSE)
    for tag, node in (("on", on), ("off", off)):
        served = calc_served(node.pycnid.log())
        out[tag]["served_ms"] = [served.get(cid, {}).get("both") for cid in out[tag]["ids"]]
        out[tag]["svc_ms"] = [served.get(cid, {}).get("svc") for cid in out[tag]["ids"]]
    return out


def calc_served(log_text: str) -> dict[str, dict[str, float]]:
    """Per container id, the milliseconds pycnid's log (JSON lines, pycnid/dispatch.py's
    "request served") gives its last bridge and svc ADDs: ``bridge``, ``svc``, and ``both``
    (their sum, only when it served the two). Other lines are skipped."""
    found: dict[str, dict[str, float]] = {}
    for text in log_text.splitlines():
        try:
            entry = json.loads(text)
        except ValueError:
            continue
        if not isinstance(entry, dict) or entry.get("msg") != "request served":
            continue
        plugin, cid = entry.get("plugin"), entry.get("containerID")
        if entry.get("command") == "ADD" and plugin in ("bridge", "svc") and cid:
            found.setdefault(str(cid), {})[str(plugin)] = float(entry["ms"])
    for times in found.values():
        if "bridge" in times and "svc" in times:
            times["both"] = times["bridge"] + times["svc"]
    return found


def add_one(
    node: PolicyNode, name: str, failed: list[str], undo: list
) -> tuple[float | None, str]:
    """One timed ADD of a fresh Pod: (seconds or None if it failed, its container id); its
    DELs and its namespace's removal go on ``undo``."""
    pod = node.box.pods(f"{name}-", 1)[0]
    undo.append(lambda: node.box.drop_namespaces([pod]))
    cid = new_cid()
    try:
        took, _ip, remove = node.add(pod, "ns0", name, {"app": "a0"}, cid)
    except AddFailed as exc:
        failed.append(str(exc))
        return None, cid
    undo.append(remove)
    return took, cid


# --- (e) first packet ----------------------------------------------------------------------
@dataclass
class Pair:
    client: str  # netns path
    server: str
    server_ip: str
    twin_ip: str  # a second server Pod, which no policy selects


def setup_pair(node: PolicyNode, undo: list) -> Pair:
    client, server, twin = node.box.pods("fp-", 3)
    _, _, remove = node.add(client, FP_NS, "client", {"role": "client"})
    undo.append(remove)
    ips = []
    for pod, role in ((server, "server"), (twin, "twin")):
        _, ip, remove = node.add(pod, FP_NS, role, {"role": role})
        undo.append(remove)
        ips.append(ip)
        name = pod.rsplit("/", 1)[1]
        proc = subprocess.Popen(["ip", "netns", "exec", name, sys.executable, "-c", SERVER])
        node.box.processes.append(proc)
    pair = Pair(client, server, *ips)
    connects(pair, 1)  # the servers listen
    return pair


def allow_policy() -> tuple[str, bytes]:
    spec = {
        "podSelector": {"matchLabels": {"role": "server"}},
        "ingress": [
            {
                "from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                "ports": [{"protocol": "TCP", "port": FP_PORT}],
            }
        ],
    }
    return records.policy_kv(parse_policy(records.manifest(FP_NS, "allow", spec)))


def connects(pair: Pair, count: int) -> tuple[list[float], list[float]]:
    """``count`` connects to the server and as many to its twin, in turn from one client
    process: (the server's seconds, the twin's), the i-th of each made side by side."""
    name = pair.client.rsplit("/", 1)[1]
    cmd = ["ip", "netns", "exec", name, sys.executable, "-c", CLIENT]
    ips = f"{pair.server_ip},{pair.twin_ip}"
    for _ in range(100):
        out = subprocess.run([*cmd, ips, str(FP_PORT), str(count)], capture_output=True)
        if out.returncode == 0:
            server, twin = json.loads(out.stdout)
            return [float(x) for x in server], [float(x) for x in twin]
        time.sleep(0.1)
    raise RuntimeError(f"the client cannot connect: {out.stderr.decode()[-500:]}")


def figures(values: list[float]) -> dict:
    return {"p50": median(values), "p90": percentile(values, 90), "n": len(values)}


class Phases:
    """The three states of the first-packet figure, switched in the node (the store's
    policies and pycnid's table; the linear table loaded with nft)."""

    def __init__(self, node: PolicyNode, pair: Pair, timeout: float) -> None:
        self.node, self.pair, self.timeout = node, pair, timeout
        self.counter = f"dropped-in/{FP_NS}/server"  # made when fp/allow isolates the server
        store = SqliteStore(node.store_path)
        try:
            store.txn([], [Put(*allow_policy())])
            self.kept = [(kv.key, kv.value) for kv in store.range(NETPOLS)]
        finally:
            store.close()
        self.script = ""

    def policies(self) -> None:
        store = SqliteStore(self.node.store_path)
        try:
            records.write_records(store, iter(self.kept))
            self.script = self.script or linear.render_linear(store, self.pair.server_ip)
        finally:
            store.close()
        if not wait_until(lambda: self.node.has_counter(self.counter), self.timeout):
            raise RuntimeError("the server Pod was not isolated")

    def none(self) -> None:
        store = SqliteStore(self.node.store_path)
        try:
            store.txn([], [Delete(k) for k, _ in self.kept])
        finally:
            store.close()
        if not wait_until(lambda: not self.node.has_counter(self.counter), self.timeout):
            raise RuntimeError("the policies were not removed")

    def settle(self) -> None:
        """Once the kernel holds a state, wait for pycnid to be idle before connecting: the
        pass that just programmed it is followed by its drop counters' read and the
        collector's work, and on two cores that CPU would race the client's connects (the
        figure is the kernel's per-connection cost, a few microseconds)."""
        if wait_idle(self.node.pycnid.proc, self.timeout) is None:
            raise RuntimeError(f"pycnid was not idle within {self.timeout:g}s")

    def linear_on(self) -> None:
        self.node.netns.run(["nft", "-f", "-"], input=self.script)

    def linear_off(self) -> None:
        self.node.netns.run(["nft", "delete", "table", "inet", linear.TABLE], check=False)


#: The first-packet figure's states, in the order of even rounds (odd rounds: reversed).
STATES = ("policies", "none", "linear")


def measure_first_packet(
    node: PolicyNode, pair: Pair, count: int, rounds: int, timeout: float
) -> dict:
    """Every policy (+ fp/allow), none, none + the linear ruleset, ``rounds`` times in turn
    (``count`` connects each in all), the order reversed every other round. Per state: the
    figures of the server's connects, each round's p50, the twin's figures, and ``paired``:
    the p50 of each server connect minus the twin's beside it (``connects``).

    Each state's client runs apart, and its p50 moved by ~10-20 µs from one round to the
    next (-17.5 -19.2 -0.1 +10.9 µs, policies minus none, in one run), over a figure of a few
    µs; the twin, which no policy selects, is connected to in the same loop, so what moved
    both is taken out of ``paired``."""
    phases = Phases(node, pair, timeout)
    found: dict[str, dict[str, list[float]]] = {
        state: {"server": [], "twin": [], "paired": [], "rounds": []} for state in STATES
    }
    share = max(1, count // rounds)
    for r in range(rounds):
        for state in STATES if r % 2 == 0 else STATES[::-1]:
            server, twin = connect_in(phases, pair, state, share)
            seen = found[state]
            seen["server"] += server
            seen["twin"] += twin
            seen["paired"] += [a - b for a, b in zip(server, twin, strict=True)]
            seen["rounds"].append(median(server))
    out: dict[str, Any] = {
        state: {
            **figures(seen["server"]),
            "rounds": seen["rounds"],
            "twin": figures(seen["twin"]),
            "paired": median(seen["paired"]),
        }
        for state, seen in found.items()
    }
    out["linear_rules"] = phases.script.count("\nadd rule ")
    return out


def connect_in(
    phases: Phases, pair: Pair, state: str, count: int
) -> tuple[list[float], list[float]]:
    """``connects`` once the node is in ``state`` (one of ``STATES``) and idle."""
    if state == "policies":
        phases.policies()
    else:
        phases.none()
    if state != "linear":
        phases.settle()
        return connects(pair, count)
    phases.linear_on()
    try:
        phases.settle()
        return connects(pair, count)
    finally:
        phases.linear_off()


# --- the run -------------------------------------------------------------------------------
def measure(box: Sandbox, cni_bin: str, sizes: records.Sizes, args: Any) -> dict:
    """Not enforcing first (the first-packet Pods are added then, so that they do not wait
    for a pass), then enforcing; the same store throughout. The ADDs' anchor is a second
    node, not enforcing (``measure_adds``)."""
    node = make_node(box, cni_bin, sizes)
    anchor = make_node(box, cni_bin, sizes, "np-anchor")
    anchor.pids = node.pids  # one list: the report's residue check covers both pycnids
    undo: list = []
    try:
        out: dict = {"on": {}, "off": {}, "pids": node.pids}
        node.restart(False, None, args.timeout)
        pair = setup_pair(node, undo)
        out["off"]["rss_kib"] = node.rss_kib(args.settle)
        out["on"]["start_to_programmed"] = node.restart(True, sizes.policies, args.timeout)
        out["on"]["rss_kib"] = node.rss_kib(args.settle)
        anchor.restart(False, None, args.timeout)
        out["on"]["idle_after"] = wait_idle(node.pycnid.proc, args.timeout)
        out["off"]["idle_after"] = wait_idle(anchor.pycnid.proc, args.timeout)
        adds = measure_adds(node, anchor, args.adds, undo)
        out["on"]["adds"], out["off"]["adds"] = adds["on"], adds["off"]
        out["first_packet"] = measure_first_packet(
            node, pair, args.connects, args.rounds, args.timeout
        )
        return out
    finally:
        for remove in reversed(undo):
            remove()
        node.pycnid.stop()
        anchor.pycnid.stop()

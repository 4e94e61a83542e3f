"""Drive pycni-ipam on cluster nodes the way a runtime does: the real executable, many at once.

Each request execs ``pycni-ipam`` (stdin = netconf, CNI_* env, the pod netns fd passed on to the
daemon) against one node's pycnid socket. The executable is started from the test's namespace,
not inside the node's: a unix socket is reached by path from any netns and IPAM never touches
the caller's network, so ``ip netns exec`` would only add a fork and a mount per call.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tests.fixtures.cluster import ClusterNode
from tests.fixtures.plugins import PluginRun, run_plugin

NETWORK = "clusternet"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def netconf(ranges: list | None = None, name: str = NETWORK, **ipam) -> dict:
    ranges = ranges if ranges is not None else [[{"subnet": "10.96.0.0/20", "blockSize": 26}]]
    return {
        "cniVersion": "1.1.0",
        "name": name,
        "type": "ptp",
        "ipam": {"type": "pycni-ipam", "ranges": ranges, **ipam},
    }


@dataclass
class Call:
    node: str
    cid: str
    command: str
    run: PluginRun
    seconds: float

    @property
    def ok(self) -> bool:
        return self.run.ok

    @property
    def code(self) -> int | None:
        return self.run.error_code()

    def ips(self) -> list[str]:
        return [ip["address"].split("/")[0] for ip in (self.run.json or {}).get("ips", [])]


def ipam(
    cni_bin: str,
    node: ClusterNode,
    command: str,
    conf: dict,
    cid: str = "",
    args: str = "",
    timeout: float = 60,
) -> Call:
    started = time.monotonic()
    run = run_plugin(
        os.path.join(cni_bin, "pycni-ipam"),
        command,
        conf,
        container_id=cid,
        netns=node.pod.path if command in ("ADD", "CHECK") else "",
        args=args,
        cni_path=cni_bin,
        socket=node.socket,
        timeout=timeout,
    )
    return Call(node.name, cid, command, run, time.monotonic() - started)


def run_all(
    cni_bin: str, jobs: list[tuple[ClusterNode, str, str]], conf: dict, per_node: int = 16
) -> list[Call]:
    """Run (node, command, cid) jobs with ``per_node`` in flight on each node at once."""
    nodes = {node.name for node, _, _ in jobs}
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=per_node * len(nodes)) as pool:
        return list(pool.map(lambda job: ipam(cni_bin, job[0], job[1], conf, job[2]), jobs))


def run_with_incident(
    cni_bin: str,
    jobs: list[tuple[ClusterNode, str, str]],
    conf: dict,
    after: int,
    incident: Callable[[], None],
    per_node: int = 16,
) -> tuple[list[Call], int]:
    """Like ``run_all``, but once ``after`` calls have finished ``incident()`` runs (in this
    thread) while the others are still in flight; returns (calls, calls finished before it)."""
    nodes = {node.name for node, _, _ in jobs}
    finished = 0
    lock = threading.Lock()
    reached = threading.Event()

    def one(job: tuple[ClusterNode, str, str]) -> Call:
        nonlocal finished
        call = ipam(cni_bin, job[0], job[1], conf, job[2])
        with lock:
            finished += 1
            if finished >= after:
                reached.set()
        return call

    with ThreadPoolExecutor(max_workers=per_node * len(nodes)) as pool:
        futures = [pool.submit(one, job) for job in jobs]
        reached.wait()
        with lock:
            before = finished
        incident()
        return [f.result() for f in futures], before


def interleave(
    nodes: list[ClusterNode], command: str, count: int, cid=lambda node, i: f"{node.name}-c{i}"
) -> list[tuple[ClusterNode, str, str]]:
    """``count`` jobs per node, interleaved so every node is busy for the whole run."""
    return [(node, command, cid(node, i)) for i in range(count) for node in nodes]


def pycni_ipam_cli(
    node: ClusterNode, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess:
    """`pycni ipam ARGS` run inside the node's namespace with its daemon's config."""
    cmd = [
        "ip",
        "netns",
        "exec",
        node.host.ns.name,
        sys.executable,
        "-m",
        "cli",
        "ipam",
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


def gc_conf(conf: dict, valid: list[tuple[str, str]]) -> dict:
    """The netconf of a CNI GC request naming the attachments that are still valid."""
    return {
        **conf,
        "cni.dev/valid-attachments": [
            {"containerID": cid, "ifname": ifname} for cid, ifname in valid
        ],
    }

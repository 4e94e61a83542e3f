"""Figure (b) of `make bench-netpol`: a policy change put in etcd -> the other node's kernel.

Two pycnids (node1, node2) in their own namespaces on a real etcd (tests/fixtures/cluster.py,
as bench/svc_api.py starts them), both with ``networkPolicy.enforce`` and the Service proxy.
First the anchor, in the same cluster before any NetworkPolicy record exists: ``--svc-services``
bulk Services x 5 written from node1 (bench/svc_e2e_load.py), then endpoint changes put ->
node2's kernel (bench/svc_e2e_kernel.py's poller and changes: the store-fed Service update of
bench-svc-e2e). Then the synthetic NetworkPolicy records (bench/netpol_records.py, node2 the
measured node) are written from node1 and node2 programs them; once node2's pycnid is idle
(``wait_idle``: its CPU time still), each change updates policy
``spare/bench-change<r>`` so that it selects spare Pod ``r`` of node2: put -> the Pod's drop
counter ``dropped-in/spare/spare<r>`` is in node2's kernel (it is made in the same transaction
as the Pod's ``ingress4`` element and chain, ``netpol/render.py``), asked for every 2 ms by
``COUNTER_POLLER``: one netlink GETOBJ for that counter alone. Through libnftables a ``list
counter`` fetched the whole table first, ~150-180 ms a poll at 1,000 policies (so the figure
was mostly the poller's own listing: up to 2026-12-02 it measured 150-415 ms p50 while
node2's pass began ~1 ms after the change reached it and took ~35 ms).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from typing import Any

from netpol.render import TABLE
from services.record import ServiceSettings
from store.keys import SERVICES_META
from tests.fixtures.cluster import Cluster

from . import netpol_records as records
from . import svc_e2e_kernel as kernel
from .common import REPO, python_env
from .driver import wait_idle
from .netpol_node import RENDERED
from .overlay_topo import QUIET_DAEMON
from .svc_e2e import CIDR, write_bulk_from
from .svc_e2e_load import METRICS, services_metric, wait_metric

DAEMON: dict[str, Any] = {
    **QUIET_DAEMON,
    "logLevel": "info",
    "metricsAddress": METRICS,
    "services": {"proxy": True, "resyncInterval": 3600},
    "networkPolicy": {"enforce": True, "resyncInterval": 3600},
}


def start_cluster() -> Cluster:
    cluster = Cluster.create(1)
    try:
        cluster.etcd.start()
        for _ in range(2):
            cluster.add_node(**DAEMON)
    except BaseException:
        cluster.close()
        raise
    return cluster


def measure_anchor(cluster: Cluster, services: int, count: int, timeout: float) -> dict:
    """The store-fed Service update on node2 (bench-svc-e2e's), before any policy."""
    node1, node2 = cluster.nodes
    cluster.etcd.put(SERVICES_META, ServiceSettings((CIDR,)).to_bytes())
    write_bulk_from(node1, cluster.etcd.endpoints, services, 5)
    done, _ = wait_metric(node2.host.ns.name, lambda s: services_metric(s) >= services, timeout)
    if done is None:
        raise RuntimeError(f"node2 did not program {services} Services in {timeout:g}s")
    poller = kernel.start_poller(node2)
    try:
        return kernel.measure_updates(cluster, poller, services, 5, count, timeout)
    finally:
        close_poller(poller)


def write_policies(cluster: Cluster, sizes: records.Sizes, spares: int) -> float:
    """Every synthetic record into etcd from node1 (the store's txn); seconds it took."""
    node1 = cluster.nodes[0]
    cmd = ["ip", "netns", "exec", node1.host.ns.name, sys.executable, "-m"]
    cmd += ["bench.netpol_records", "--write", ",".join(cluster.etcd.endpoints)]
    cmd += [str(sizes.policies), str(sizes.pods), str(sizes.local), sizes.node, str(spares)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=python_env())
    if out.returncode != 0:
        raise RuntimeError(f"NetworkPolicy writer: {out.stderr[-2000:]}")
    return float(json.loads(out.stdout)[0])


def wait_rendered(node, policies: int, timeout: float) -> float | None:
    """Seconds until ``node``'s pycnid logged a render of ``policies`` policies."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if any(int(m[1]) >= policies for m in RENDERED.finditer(node.daemon.log())):
            return time.monotonic() - started
        if node.daemon.proc.poll() is not None:
            raise RuntimeError(f"{node.name}'s pycnid exited: {node.daemon.log()[-2000:]}")
        time.sleep(0.05)
    return None


def timed_policy_change(cluster: Cluster, poller, r: int, timeout: float) -> dict:
    """Policy ``spare/bench-change<r>`` now selects spare Pod ``r``: put -> its counter."""
    counter = f"dropped-in/{records.SPARE_NS}/spare{r}"
    kernel.arm(poller, counter, counter, timeout)
    key, value = records.policy_kv(records.calc_spare_policy(r, selects=True))
    started = time.monotonic()
    cluster.etcd.put(key, value)
    put_done = time.monotonic()
    done, polls = kernel.answer(poller)
    return {
        "put_to_programmed": None if done is None else done - started,
        "put": put_done - started,
        "polls": polls,
    }


#: node2's own account of a pass that changed its table after a store change (netpol/sync.py's
#: log line): how much of a change's time is the pass itself, how much comes before it
PASS_LOGGED = re.compile(
    r"netpol: table (?:updated|rendered): [^\n]*?, ([\d.]+) ms \(begun ([\d.]+) ms after"
)


def measure_changes(cluster: Cluster, sizes: records.Sizes, count: int, timeout: float) -> dict:
    node2 = cluster.nodes[1]
    out: dict = {"write_seconds": write_policies(cluster, sizes, count)}
    out["programmed_after"] = wait_rendered(node2, sizes.policies + count, timeout)
    # node2's Service proxy and NetworkPolicy are still taking in the 10,000 Pods' endpoint
    # records for a second or two after the render: a change timed then measured that backlog
    # (passes of 300-500 ms), not a policy change on a settled node
    out["idle_after"] = wait_idle(node2.daemon.proc, timeout)
    poller = start_counter_poller(node2)
    logged = len(node2.daemon.log())
    try:
        runs = [timed_policy_change(cluster, poller, r, timeout) for r in range(count)]
    finally:
        close_poller(poller)
    found = list(PASS_LOGGED.finditer(node2.daemon.log()[logged:]))
    passes = [float(m[1]) / 1e3 for m in found]
    begun = [float(m[2]) / 1e3 for m in found]
    return {**out, **kernel.summarize(runs), "passes": passes, "begun_after": begun}


#: The counter's poller, in node2's netns (stdin: "WANT<TAB>TIMEOUT<TAB>COUNTER NAME", as
#: bench/svc_e2e_kernel.py's): a GETOBJ naming the table, the counter and its type, answered
#: by the kernel with that object (NEWOBJ) or ENOENT, without a dump of anything else.
COUNTER_POLLER = """
import socket, struct, sys, time
GETOBJ, NEWOBJ, ERROR = (10 << 8) | 19, (10 << 8) | 18, 2
def attr(kind, data):
    return struct.pack("=HH", 4 + len(data), kind) + data + b"\\0" * (-len(data) % 4)
sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)
sock.bind((0, 0))
seq = 0
def exists(table, name):
    global seq
    seq += 1
    body = struct.pack("=BBH", 1, 0, 0) + attr(1, table.encode() + b"\\0")
    body += attr(2, name.encode() + b"\\0") + attr(3, struct.pack(">I", 1))
    sock.send(struct.pack("=IHHII", 16 + len(body), GETOBJ, 1, seq, 0) + body)
    data = sock.recv(65536)
    kind = struct.unpack_from("=H", data, 4)[0]
    if kind == ERROR and struct.unpack_from("=i", data, 16)[0] != 0:
        return False
    return kind == NEWOBJ
for line in sys.stdin:
    _want, limit, name = line.rstrip("\\n").split("\\t", 2)
    deadline, polls, found = time.monotonic() + float(limit), 0, False
    while not found and time.monotonic() < deadline:
        found = not name or exists("TABLE", name)
        polls += 1
        if not found:
            time.sleep(0.002)
    print("ok" if found else "timeout", repr(time.monotonic()), polls, flush=True)
""".replace("TABLE", TABLE)


def start_counter_poller(node) -> subprocess.Popen:
    """``COUNTER_POLLER`` in ``node``'s netns, once it answered a first (empty) request."""
    cmd = ["ip", "netns", "exec", node.host.ns.name, sys.executable, "-c", COUNTER_POLLER]
    poller = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    kernel.arm(poller, "", "", 60.0)
    kernel.answer(poller)
    return poller


def close_poller(poller: subprocess.Popen) -> None:
    if poller.stdin:
        poller.stdin.close()
    poller.wait(10)


def measure(sizes: records.Sizes, services: int, count: int, timeout: float) -> dict:
    """Anchor then figure, in one cluster; the namespaces it made (for the residue check)."""
    cluster = start_cluster()
    try:
        anchor = measure_anchor(cluster, services, count, timeout)
        figure = measure_changes(cluster, sizes, count, timeout)
    finally:
        underlay = cluster.underlay
        made = [underlay.ns.name, *(h.ns.name for h in underlay.hosts)]
        dirs = [cluster.workdir, cluster.etcd.workdir]
        pids = [m.proc.pid for m in cluster.etcd.members if m.proc] + [
            n.daemon.proc.pid for n in cluster.nodes if n.daemon.proc
        ]
        cluster.close()
    return {"anchor": anchor, "figure": figure, "namespaces": made, "dirs": dirs, "pids": pids}

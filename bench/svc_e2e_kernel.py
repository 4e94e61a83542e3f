"""The kernel's side of bench/svc_e2e.py at scale: when a change is *programmed*, read from the
node's ruleset, not from pycnid's metrics (a scrape spawns a thread in the netns and renders the
registry: ~200 ms, where the pass itself costs ~1 ms).

One long-lived poller in node2's netns keeps a libnftables context and lists the small
``hairpin`` set every 2 ms until the wanted element shows. Why not ``get element`` on
``backends-tcp``: nft 1.0.6 fills the elements of *every* set of the table into its cache for a
``get element`` once the ruleset generation moved (measured: 0.3-0.4 s a poll at 50k elements),
where ``list set`` of one small set fetches that set only (~0.2 ms). A hairpin element exists
for a backend local to the node, so the changed endpoint is made node2's: its hairpin element
and its ``backends-tcp``/``service-ips`` elements are in the same atomic transaction, and the
element showing means that transaction is in the kernel (a create is checked once afterwards
with ``get element`` on ``service-ips``, by a second poller: that command fills the context's
cache with every element of the table, and the next command of that context releases them all
first, ~0.3 s at 50k elements; in the timing poller that teardown was the first poll of the next
create, and most of what was measured as a create's latency).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

from services.record import EndpointRecord, ServicePort, ServiceRecord, service_ip_key
from tests.fixtures.cluster import Cluster

from .common import median, percentile
from .svc_e2e_load import calc_bulk_service

TABLE = "ip pycni-svc"
KERNEL_POLLER = """
import sys, time, nftables
nft = nftables.Nftables()
for line in sys.stdin:
    want, limit, cmd = line.rstrip("\\n").split("\\t", 2)
    deadline, polls, found = time.monotonic() + float(limit), 0, False
    while not found and time.monotonic() < deadline:
        rc, out, _ = nft.cmd(cmd)
        polls += 1
        found = rc == 0 and want in out
        if not found:
            time.sleep(0.002)
    print("ok" if found else "timeout", repr(time.monotonic()), polls, flush=True)
"""


def start_poller(node) -> subprocess.Popen:
    """The kernel poller in ``node``'s netns (stdin: "WANT<TAB>TIMEOUT<TAB>nft command"),
    once it answered a first command: its start (Python, libnftables) is no change's time."""
    cmd = ["ip", "netns", "exec", node.host.ns.name, sys.executable, "-c", KERNEL_POLLER]
    poller = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    arm(poller, "", "list tables", 60.0)
    answer(poller)
    return poller


def arm(poller: subprocess.Popen, want: str, command: str, timeout: float) -> None:
    poller.stdin.write(f"{want}\t{timeout}\t{command}\n")
    poller.stdin.flush()


def answer(poller: subprocess.Popen) -> tuple[float | None, int]:
    """(monotonic stamp the element showed, polls made), None after the poller's timeout."""
    word, stamp, polls = poller.stdout.readline().split()
    return (float(stamp) if word == "ok" else None), int(polls)


def timed_put(
    cluster: Cluster, poller, keys: list[tuple[str, bytes]], hairpin_ip: str, timeout: float
) -> dict:
    """Put ``keys`` in order (the last one is the change, timed) until ``hairpin_ip``'s
    element is in the kernel."""
    for key, value in keys[:-1]:
        cluster.etcd.put(key, value)
    return timed_change(poller, lambda: cluster.etcd.put(*keys[-1]), hairpin_ip, timeout)


def timed_change(poller, change: Callable[[], object], hairpin_ip: str, timeout: float) -> dict:
    """Arm the poller for ``hairpin_ip``'s element, make ``change`` (a store put, an API
    object put), until the element is in the kernel."""
    arm(poller, f"{hairpin_ip} . {hairpin_ip}", f"list set {TABLE} hairpin", timeout)
    started = time.monotonic()
    change()
    put_done = time.monotonic()
    done, polls = answer(poller)
    return {
        "put_to_programmed": None if done is None else done - started,
        "put": put_done - started,
        "polls": polls,
    }


def measure_updates(
    cluster: Cluster, poller, services: int, per_service: int, count: int, timeout: float
) -> dict:
    """``count`` Services spread over the bulk: endpoint 0 moves to a new IP on node2."""
    node = cluster.nodes[1].name
    runs = []
    for r in range(count):
        key, value = calc_bulk_service(services * (r + 1) // (count + 1), per_service)[2]
        old = EndpointRecord.from_bytes(key, value)
        ip = f"10.199.0.{r + 1}"
        moved = EndpointRecord(old.namespace, old.pod, old.ifname, (ip,), old.labels, node)
        runs.append(timed_put(cluster, poller, [(moved.key, moved.to_bytes())], ip, timeout))
    return summarize(runs)


def calc_late_service(r: int, node: str) -> tuple[list[tuple[str, bytes]], str]:
    """Create ``r`` at scale: its endpoint (on ``node``, selected by nothing yet), its VIP
    index key, then the Service record (the change timed); and its service-ips key."""
    vip, ip, app = f"10.96.250.{r + 1}", f"10.198.0.{r + 1}", f"late{r}"
    ep = EndpointRecord("bench", f"late{r}-0", "eth0", (ip,), {"app": app}, node)
    svc = ServiceRecord(
        "bench",
        app,
        ports=(ServicePort("", "TCP", 80, 8080),),
        cluster_ips=(vip,),
        selector={"app": app},
    )
    keys = [
        (ep.key, ep.to_bytes()),
        (service_ip_key(vip), svc.ref.encode()),
        (svc.key, svc.to_bytes()),
    ]
    return keys, f"{vip} . tcp . 80"


def measure_creates(cluster: Cluster, poller, checker, count: int, timeout: float) -> dict:
    """``count`` Services created one by one at scale; each checked in service-ips after
    (by ``checker``, a poller of its own: see the module docstring)."""
    runs = []
    for r in range(count):
        keys, entry = calc_late_service(r, cluster.nodes[1].name)
        run = timed_put(cluster, poller, keys, f"10.198.0.{r + 1}", timeout)
        arm(checker, entry, f"get element {TABLE} service-ips {{ {entry} }}", 5.0)
        run["in_service_ips"] = answer(checker)[0] is not None
        runs.append(run)
    return summarize(runs)


def summarize(runs: list[dict]) -> dict:
    values = [r["put_to_programmed"] for r in runs]
    done = [v for v in values if v is not None]
    return {
        "runs": runs,
        "timeouts": len(values) - len(done),
        "p50": median(done) if done else None,
        "max": percentile(done, 100) if done else None,
    }

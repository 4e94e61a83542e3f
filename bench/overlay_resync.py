"""Full resync with many synthetic peers, and pycnid's memory with them (vxlan, one real node).

Synthetic peers are node records with overlay fields and one affinity key each, written
straight into etcd (through ``nodes.record`` / ``ipam.records``, in txns of 128 puts
through etcd's HTTP gateway) for nodes that do not run. Measured on the real node:

- write -> kernel: from the first txn until ``ip monitor`` has announced all N routes, N
  neighbours and N FDB entries (and from the last txn);
- a steady resync pass (nothing to change: registry view -> desired -> dump + diff): the
  ``pycni_overlay_sync_seconds`` histogram over the periodic passes that follow;
- cold: pycnid stopped, its VXLAN device deleted (every entry goes with it), pycnid started:
  from exec until the kernel holds all 3N entries again, and the programming pass itself (the
  histogram's first pass);
- VmRSS of pycnid before the peers and with them.

Goal (a pycnid restart or a full resync in a large cluster takes seconds, not minutes): 1,000
peers programmed <= 2 s.
"""

from __future__ import annotations

import base64
import ipaddress
import sys
import time
import urllib.request

from ipam.records import AffinityRecord
from nodes.record import NodeRecord, OverlayInfo, node_key
from overlay.config import calc_vtep_mac
from store.keys import affinity_key
from tests.fixtures.etcd import run_in_netns

from .common import vm_rss_kib
from .overlay_topo import start_cluster
from .overlay_watch import KernelWatch

GOAL = 2.0
POOL = "synthetic"
BLOCKS = ipaddress.ip_network("10.160.0.0/12")
UNDERLAYS = ipaddress.ip_network("10.250.0.0/16")
METRICS = "127.0.0.1:9464"
RESYNC = 3
TIMEOUT = 60.0


def synthetic_peer(i: int, now: float) -> tuple[list[tuple[str, bytes]], tuple[str, str, str]]:
    """Peer ``i``'s two keys, and (block, VTEP, underlay) the kernel should then hold."""
    block = ipaddress.ip_network((int(BLOCKS.network_address) + 64 * i, 26))
    vtep, underlay = str(block.network_address + 1), str(UNDERLAYS.network_address + 1 + i)
    name = f"synth{i:04d}"
    info = OverlayInfo("vxlan", underlay, calc_vtep_mac(name), (vtep,), 1, 4789, 1450)
    keys = [
        (affinity_key(name, POOL, block), AffinityRecord(POOL, str(block), now).to_bytes()),
        (node_key(name), NodeRecord(name, underlay, overlay=info).to_bytes()),
    ]
    return keys, (str(block), vtep, underlay)


def write_peers(etcd, peers: list[list[tuple[str, bytes]]]) -> tuple[float, float]:
    """Every peer's keys, 64 peers (128 puts, etcd's default limit) a txn; (first, last)
    wall-clock times: before the first txn, after the last one answered."""
    first = time.time()
    for start in range(0, len(peers), 64):
        ops = [
            {"requestPut": {"key": b64(key), "value": base64.b64encode(value).decode()}}
            for keys in peers[start : start + 64]
            for key, value in keys
        ]
        etcd.call("/v3/kv/txn", {"success": ops})
    return first, time.time()


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def wait_programmed(
    watch: KernelWatch, since: float, wanted: list[tuple[str, str, str]]
) -> float | None:
    """Stamp of the last of the 3N entries announced after ``since`` (None: not in TIMEOUT)."""
    routes = {b for b, _, _ in wanted}
    vteps = {v for _, v, _ in wanted}
    underlays = {u for _, _, u in wanted}
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        seen: dict[str, set[str]] = {"route": set(), "neigh": set(), "fdb": set()}
        last = since
        with watch.lock:
            events = [e for e in watch.events if e.at >= since and not e.deleted]
        for event in events:
            head = event.text.split(" ", 1)[0]
            kind = (
                "route"
                if head in routes
                else "neigh"
                if head in vteps
                else "fdb"
                if head in underlays and "lladdr" in event.text
                else None
            )
            if kind and (kind != "neigh" or "lladdr" in event.text):
                seen[kind].add(head)
                last = max(last, event.at)
        if all(len(s) == len(wanted) for s in seen.values()):
            return last
        time.sleep(0.05)
    return None


def sync_histogram(ns: str) -> tuple[float, int]:
    """(sum, count) of pycni_overlay_sync_seconds from the node's metrics endpoint."""

    def scrape() -> str:
        with urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=5) as response:
            return response.read().decode()

    total, count = 0.0, 0
    for line in run_in_netns(ns, scrape).splitlines():
        if line.startswith("pycni_overlay_sync_seconds_sum"):
            total = float(line.split()[-1])
        elif line.startswith("pycni_overlay_sync_seconds_count"):
            count = int(float(line.split()[-1]))
    return total, count


def steady_pass(ns: str, resync: int, passes: int = 3) -> float | None:
    """Mean time of the next ``passes`` periodic resync passes (nothing changes), ``resync``
    seconds apart."""
    total, count = sync_histogram(ns)
    deadline = time.monotonic() + resync * (passes + 2) + 10
    while time.monotonic() < deadline:
        time.sleep(resync)
        now_total, now_count = sync_histogram(ns)
        if now_count - count >= passes:
            return (now_total - total) / (now_count - count)
    return None


def cold_restart(node, watch: KernelWatch, wanted: list) -> dict:
    node.daemon.stop()
    node.host.ns.run(["ip", "link", "del", "pycni.1"])
    started = time.time()
    node.daemon.start(timeout=60)
    done = wait_programmed(watch, started, wanted)
    total, count = sync_histogram(node.host.ns.name)
    return {
        "exec_to_programmed": None if done is None else done - started,
        "first_passes_mean": total / count if count else None,
        "passes": count,
    }


def measure(cni_bin: str, peers: int, resync: int = RESYNC) -> dict:
    print(
        f"--> resync: {peers} synthetic vxlan peers on one real node", file=sys.stderr, flush=True
    )
    built = start_cluster(
        "vxlan",
        1,
        cni_bin,
        cidr="10.133.0.0/16",
        daemon={"metricsAddress": METRICS},
        resyncInterval=resync,
    )
    node = built.nodes[0]
    watch = KernelWatch(node.host.ns.name)
    try:
        time.sleep(1.0)
        rss_before = vm_rss_kib(node.daemon.proc.pid)
        now = time.time()
        made = [synthetic_peer(i, now) for i in range(peers)]
        first, last = write_peers(built.cluster.etcd, [keys for keys, _ in made])
        wanted = [want for _, want in made]
        done = wait_programmed(watch, first, wanted)
        out = {
            "peers": peers,
            "write_seconds": last - first,
            "write_to_programmed": None if done is None else done - first,
            "last_write_to_programmed": None if done is None else done - last,
            "steady_pass": steady_pass(node.host.ns.name, resync),
            "rss_kib_before": rss_before,
            "rss_kib": vm_rss_kib(node.daemon.proc.pid),
        }
        out["cold"] = cold_restart(node, watch, wanted)
        out["entries_in_kernel"] = count_entries(node)
    finally:
        watch.close()
        built.cluster.close()
    return out


def count_entries(node) -> dict[str, int]:
    """What the kernel holds at the end (a dump, to back the monitor's count)."""

    def lines(cmd: list[str]) -> int:
        return len(node.host.ns.run(cmd).stdout.splitlines())

    return {
        "routes": lines(["ip", "route", "show", "proto", "77"]),
        "neighs": lines(["ip", "neigh", "show", "dev", "pycni.1", "nud", "permanent"]),
        "fdbs": lines(["bridge", "fdb", "show", "dev", "pycni.1"]),
    }

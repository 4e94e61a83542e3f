"""Join and leave convergence with N node namespaces (vxlan), observed from outside pycni.

N-1 nodes run pycnid and settle (one Pod on node1, the ping source); the N-th node, with
``leaveOnStop``, then joins and leaves ``rounds`` times:

- join: its pycnid starts; t0 = the etcd watch delivering its node record *with* overlay fields
  (``overlay_watch.RegistryWatch``). Each peer converged when its kernel has announced (``ip
  monitor``, stamped by iproute2) a route for every block of the node (affinity index) via its
  VTEP, the neighbour VTEP -> MAC and the FDB entry MAC -> underlay; the per-peer figure is the
  last of the three minus t0. The first ping: from node1's Pod to the joining
  node's VTEP address (over the tunnel both ways; ``overlay_watch.Pinger``, an echo every
  5 ms), started when t0 is seen, and the same from node1's own namespace. The Pod's figure
  carries its ARP: it holds a pool-prefix address, so it ARPs for the VTEP and the bridge's
  proxy ARP answers only once node1 has the route; a request made before that is retried
  after the Pod's ``retrans_time`` (1 s);
- leave: SIGTERM to its pycnid; t1 = the watch delivering the record's deletion; each peer
  converged when all three entries are announced deleted.

Goal (a joining node's Pods are reachable within about a second, and a leaving node's entries
are gone as fast): join p50 <= 300 ms and max <= 1 s, first ping <= 1 s, leave max <= 1 s.
"""

from __future__ import annotations

import os
import sys
import time

from store.keys import AFFINITY, NODES, parse_block_key
from tests.overlay.pods import OverlayCluster

from .common import percentile
from .overlay_topo import add_quiet_node, start_cluster
from .overlay_watch import KernelWatch, Pinger, RegistryWatch

DEVICE = "pycni.1"
TIMEOUT = 10.0
GOALS = {"join_p50": 0.3, "join_max": 1.0, "ping_max": 1.0, "leave_max": 1.0}


def wait_until(probe, timeout: float, step: float = 0.01):
    deadline = time.monotonic() + timeout
    while (value := probe()) is None and time.monotonic() < deadline:
        time.sleep(step)
    return value


def blocks_of(built: OverlayCluster, node: str) -> list[str]:
    prefix = f"{AFFINITY}{node}/"
    return sorted(parse_block_key(key)[1] for key in built.cluster.etcd.dump(prefix))


def join_needles(record: dict, blocks: list[str]) -> list[tuple[str, ...]]:
    """What every peer's monitor must announce: a route per block, the neighbour, the FDB."""
    info = record["overlay"]
    vtep, mac = info["vteps"][0], info["vtepMAC"]
    return [
        *((f"{b} via {vtep} dev {DEVICE}",) for b in blocks),
        (f"{vtep} dev {DEVICE} lladdr {mac}",),
        (f"{info['underlay']} dev {DEVICE} lladdr {mac}",),
    ]


def leave_needles(record: dict, blocks: list[str]) -> list[tuple[str, ...]]:
    info = record["overlay"]
    vtep, mac = info["vteps"][0], info["vtepMAC"]
    return [
        *((f"{b} via {vtep} dev {DEVICE}",) for b in blocks),
        (f"{vtep} dev {DEVICE}",),
        (f"{info['underlay']} dev {DEVICE} lladdr {mac}",),
    ]


def peer_latencies(
    watches: list[KernelWatch],
    since: float,
    t0: float,
    deleted: bool,
    needles: list[tuple[str, ...]],
) -> list[float | None]:
    """Per peer: seconds from ``t0`` until every needle was announced after ``since`` (the
    round's start: a peer may be quicker than our watch), at least 0 (None: not within
    TIMEOUT)."""

    def done(watch: KernelWatch) -> float | None:
        stamps = [watch.first(since, deleted, *n) for n in needles]
        return None if None in stamps else max(0.0, max(stamps) - t0)  # type: ignore

    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and any(done(w) is None for w in watches):
        time.sleep(0.02)
    return [done(w) for w in watches]


def join_round(
    built: OverlayCluster, joiner, watch: RegistryWatch, peers: list[KernelWatch], pod_ns: str
) -> dict:
    started = time.time()
    joiner.daemon.start()
    key = f"{NODES}{joiner.name}"
    put = wait_until(lambda: watch.first(started, key, "PUT", need_overlay=True), TIMEOUT)
    if put is None:
        raise RuntimeError(f"{joiner.name}'s record with overlay fields never arrived")
    vtep = put.value["overlay"]["vteps"][0]
    pings = {
        "ping": Pinger(pod_ns, vtep, TIMEOUT),
        "ping_node": Pinger(built.nodes[0].host.ns.name, vtep, TIMEOUT),
    }
    blocks = blocks_of(built, joiner.name)
    lat = peer_latencies(peers, started, put.at, False, join_needles(put.value, blocks))
    replies = {name: pinger.wait() for name, pinger in pings.items()}
    return {
        "peers": lat,
        **{name: None if at is None else at - put.at for name, at in replies.items()},
        "record": put.value,
        "blocks": blocks,
        "start_to_record": put.at - started,
    }


def leave_round(
    joiner, watch: RegistryWatch, peers: list[KernelWatch], record: dict, blocks: list[str]
) -> dict:
    started = time.time()
    joiner.daemon.stop()
    gone = wait_until(lambda: watch.first(started, f"{NODES}{joiner.name}", "DELETE"), TIMEOUT)
    if gone is None:
        raise RuntimeError(f"{joiner.name}'s record was not deleted on a leaveOnStop stop")
    return {"peers": peer_latencies(peers, started, gone.at, True, leave_needles(record, blocks))}


def measure(cni_bin: str, nodes: int, rounds: int, settle: float) -> dict:
    """Build the cluster, settle, then ``rounds`` join + leave rounds of the last node."""
    print(
        f"--> convergence: {nodes - 1} settled vxlan nodes, node{nodes} joins and leaves "
        f"{rounds} times",
        file=sys.stderr,
        flush=True,
    )
    built = start_cluster("vxlan", nodes - 1, cni_bin, cidr="10.132.0.0/16")
    watches: list[KernelWatch] = []
    try:
        pod = built.add_pod(built.nodes[0])
        joiner = add_quiet_node(built, leaveOnStop=True)
        built.wait_vteps(timeout=30)
        joiner.daemon.stop()  # out again: every round starts from a cluster without it
        member = built.cluster.etcd.members[0]
        watch = RegistryWatch(member.netns, member.host, member.client_port, NODES)
        watches = [KernelWatch(n.host.ns.name) for n in built.nodes if n is not joiner]
        time.sleep(settle)
        load = os.getloadavg()[0]
        out = {"nodes": nodes, "rounds": [], "loadavg_at_start": round(load, 2)}
        for i in range(rounds):
            joined = join_round(built, joiner, watch, watches, pod.ns.name)
            left = leave_round(joiner, watch, watches, joined["record"], joined["blocks"])
            out["rounds"].append(
                {
                    "join": joined["peers"],
                    "ping": joined["ping"],
                    "ping_node": joined["ping_node"],
                    "leave": left["peers"],
                    "start_to_record": joined["start_to_record"],
                }
            )
            print(
                f"    round {i + 1}/{rounds}: {render_round(out['rounds'][-1])}",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(1.0)  # let the leave's aftermath (block, VTEP) settle
        watch.close()
    finally:
        for kernel in watches:
            kernel.close()
        built.cluster.close()
    return {**out, **summarize(out["rounds"])}


def render_round(r: dict) -> str:
    def ms(v: float | None) -> str:
        return "timeout" if v is None else f"{v * 1000:.0f}"

    def worst(values: list[float | None]) -> str:
        return "timeout" if None in values or not values else ms(max(values))  # type: ignore

    return (
        f"join max {worst(r['join'])} ms, ping from node1's Pod {ms(r['ping'])} ms, "
        f"from node1 {ms(r['ping_node'])} ms, leave max {worst(r['leave'])} ms"
    )


def summarize(rounds: list[dict]) -> dict:
    """p50/max over every (peer, round); a peer that never converged counts as TIMEOUT."""

    def figures(values: list[float | None]) -> dict:
        known = [TIMEOUT if v is None else v for v in values]
        return {
            "p50": percentile(known, 50),
            "max": max(known) if known else None,
            "timeouts": sum(v is None for v in values),
            "n": len(values),
        }

    return {
        "join": figures([v for r in rounds for v in r["join"]]),
        "leave": figures([v for r in rounds for v in r["leave"]]),
        "ping": figures([r["ping"] for r in rounds]),
        "ping_node": figures([r["ping_node"] for r in rounds]),
    }

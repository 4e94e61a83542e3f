"""Pod <-> Pod TCP throughput across two nodes: pycni's overlay against the same topology built
by hand (``overlay_topo``), for one backend, runs interleaved (the order flips every run so
background load falls on both alike), median of the runs. Goal: >= 0.95x (the
overlay costs no more than the same devices made by hand)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from tests.fixtures.netns import Netns
from tests.fixtures.waiting import wait_for

from .common import Sandbox, median
from .overlay_topo import build_hand, pycni_pods, run_iperf, start_cluster, start_iperf_server

GOAL = 0.95


def wait_reachable(ns: str, ip: str, what: str) -> None:
    wait_for(what, lambda: Netns(ns).ping(ip, timeout=1), timeout=20.0, step=0.2)


def measure_backend(box: Sandbox, backend: str, cni_bin: str, runs: int, seconds: float) -> dict:
    """Both topologies up at once, then ``runs`` iperf3 runs on each, interleaved."""
    hand = build_hand(box, backend, "hg" if backend == "host-gw" else "vx")
    built = start_cluster(backend, 2, cni_bin)
    try:
        ours = pycni_pods(built)
        wait_reachable(ours[0].ns.name, ours[1].ip, f"pycni {backend} Pod to Pod")
        wait_reachable(hand[0].ns, hand[1].ip, f"hand-built {backend} Pod to Pod")
        start_iperf_server(box, ours[1].ns.name)
        start_iperf_server(box, hand[1].ns)
        sides: dict[str, Callable[[], float]] = {
            "pycni": lambda: run_iperf(ours[0].ns.name, ours[1].ip, seconds),
            "hand": lambda: run_iperf(hand[0].ns, hand[1].ip, seconds),
        }
        samples: dict[str, list[float]] = {"pycni": [], "hand": []}
        for i in range(runs):
            for name in ("pycni", "hand") if i % 2 == 0 else ("hand", "pycni"):
                samples[name].append(sides[name]())
            print(
                f"    {backend} run {i + 1}/{runs}: pycni {samples['pycni'][-1] / 1e9:.2f}"
                f"  hand-built {samples['hand'][-1] / 1e9:.2f} Gbit/s",
                file=sys.stderr,
                flush=True,
            )
    finally:
        built.cluster.close()
    return summarize(samples)


def summarize(samples: dict[str, list[float]]) -> dict:
    ours, hand = median(samples["pycni"]), median(samples["hand"])
    ratio = ours / hand if hand else None
    return {
        "pycni_bps": samples["pycni"],
        "hand_bps": samples["hand"],
        "pycni_median": ours,
        "hand_median": hand,
        "ratio": ratio,
        "goal": GOAL,
        "verdict": "PASS" if ratio is not None and ratio >= GOAL else "MISS",
    }


def measure(
    box: Sandbox,
    cni_bin: str,
    runs: int,
    seconds: float,
    backends: tuple[str, ...] = ("vxlan", "host-gw"),
) -> dict[str, dict]:
    out = {}
    for backend in backends:
        print(
            f"--> throughput {backend}: {runs} interleaved iperf3 runs of {seconds:g} s a side",
            file=sys.stderr,
            flush=True,
        )
        out[backend] = measure_backend(box, backend, cni_bin, runs, seconds)
    return out

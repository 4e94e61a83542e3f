"""`make bench-overlay`: the multi-node pod network, in one run.

    python3 -m bench.overlay [--runs 5] [--seconds 3] [--nodes 20] [--rounds 5] [--peers 1000]
                             [--resync 3] [--parts throughput,convergence,resync]
                             [--results-dir DIR]

- throughput: Pod <-> Pod iperf3 across two nodes, vxlan and host-gw, each against the same
  topology built by hand with ``ip`` (bench/overlay_topo.py), interleaved, median of --runs;
- convergence: --nodes node namespaces, the last one joining and leaving --rounds times,
  observed from outside pycni (bench/overlay_converge.py);
- resync: --peers synthetic peers written into etcd for one real node (bench/overlay_resync.py).

Prints a table (goal and PASS/MISS per line) and writes JSON to bench/results/ (overlay-<time>
.json and overlay-latest.json). Only namespaces this run creates are touched. Never used as
timed assertions in the test suite.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import overlay_converge, overlay_resync, overlay_throughput
from .common import REPO, Line, Sandbox, render_goal_table, run_sandboxed

RESULTS_DIR = os.path.join(REPO, "bench", "results")
PARTS = ("throughput", "convergence", "resync")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.overlay", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="iperf3 runs a side and backend")
    parser.add_argument("--seconds", type=float, default=3.0, help="iperf3 -t")
    parser.add_argument("--nodes", type=int, default=20, help="node namespaces (convergence)")
    parser.add_argument("--rounds", type=int, default=5, help="join + leave rounds")
    parser.add_argument(
        "--settle", type=float, default=10.0, help="seconds the cluster settles before the rounds"
    )
    parser.add_argument("--peers", type=int, default=1000, help="synthetic peers (resync)")
    parser.add_argument(
        "--resync",
        type=int,
        default=overlay_resync.RESYNC,
        help="resyncInterval of the resync part's node (its steady pass waits for 3 passes)",
    )
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--results-dir", default=RESULTS_DIR)
    return parser.parse_args(argv)


def ms(value: float | None) -> str:
    return "timeout" if value is None else f"{value * 1000:.0f} ms"


def secs(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def verdict(value: float | None, limit: float) -> str:
    return "PASS" if value is not None and value <= limit else "MISS"


def throughput_lines(tp: dict) -> list[Line]:
    lines = []
    for backend, r in tp.items():
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else ""
        lines.append(
            (
                f"{backend} Pod->Pod TCP, median of {len(r['pycni_bps'])}",
                f"{r['pycni_median'] / 1e9:.2f} Gbit/s",
                f"{r['hand_median'] / 1e9:.2f} Gbit/s",
                ratio,
                f">={r['goal']:.2f}x",
                r["verdict"],
            )
        )
    return lines


def convergence_lines(cv: dict) -> list[Line]:
    join, leave, goals = cv["join"], cv["leave"], overlay_converge.GOALS
    n = f"{cv['nodes'] - 1} peers x {len(cv['rounds'])}"
    rows = [
        (f"join: peer programmed p50 ({n})", join["p50"], goals["join_p50"]),
        (
            f"join: peer programmed max ({join['timeouts']} timeouts)",
            join["max"],
            goals["join_max"],
        ),
        ("join: first ping from node1's Pod, max", cv["ping"]["max"], goals["ping_max"]),
        ("join: first ping from node1, max", cv["ping_node"]["max"], goals["ping_max"]),
        (
            f"leave: peer entries gone max ({leave['timeouts']} timeouts)",
            leave["max"],
            goals["leave_max"],
        ),
    ]
    lines: list[Line] = [
        (label, ms(v), "", "", f"<={goal * 1000:.0f} ms", verdict(v, goal))
        for label, v, goal in rows
    ]
    lines.insert(
        2,
        ("  join: first ping from node1's Pod, p50 (info)", ms(cv["ping"]["p50"]), "", "", "", ""),
    )
    lines.append(("  leave: p50 (info)", ms(leave["p50"]), "", "", "", ""))
    return lines


def resync_lines(rs: dict) -> list[Line]:
    goal, n = overlay_resync.GOAL, rs["peers"]
    cold = rs["cold"]
    before, after = rs["rss_kib_before"], rs["rss_kib"]
    return [
        (
            f"{n} peers written -> programmed",
            secs(rs["write_to_programmed"]),
            "",
            "",
            f"<={goal:.2f} s",
            verdict(rs["write_to_programmed"], goal),
        ),
        ("  from the last txn (info)", secs(rs["last_write_to_programmed"]), "", "", "", ""),
        (
            "cold: programming pass (VXLAN device deleted)",
            secs(cold["first_passes_mean"]),
            "",
            "",
            f"<={goal:.2f} s",
            verdict(cold["first_passes_mean"], goal),
        ),
        (
            "  cold: pycnid exec -> programmed (info)",
            secs(cold["exec_to_programmed"]),
            "",
            "",
            "",
            "",
        ),
        (
            "  steady resync pass, nothing to change (info)",
            secs(rs["steady_pass"]),
            "",
            "",
            "",
            "",
        ),
        (
            f"pycnid VmRSS with {n} peers (vs without)",
            f"{after / 1024:.1f} MiB" if after else "—",
            f"{before / 1024:.1f} MiB" if before else "—",
            f"{after / before:.2f}x" if after and before else "",
            "",
            "",
        ),
    ]


def render(report: dict, sections: list[tuple[str, list[Line]]]) -> str:
    return render_goal_table("bench-overlay", report, sections, "hand-built", (14, 14))


def run_parts(
    args: argparse.Namespace, box: Sandbox, cni_bin: str, report: dict
) -> list[tuple[str, list[Line]]]:
    parts = [p for p in args.parts.split(",") if p]
    sections = []
    if "throughput" in parts:
        report["throughput"] = overlay_throughput.measure(box, cni_bin, args.runs, args.seconds)
        sections.append(
            (
                f"throughput (iperf3 -t {args.seconds:g}, one stream)",
                throughput_lines(report["throughput"]),
            )
        )
    if "convergence" in parts:
        report["convergence"] = overlay_converge.measure(
            cni_bin, args.nodes, args.rounds, args.settle
        )
        sections.append(
            (
                f"convergence, {args.nodes} node namespaces (vxlan), from the etcd watch's event",
                convergence_lines(report["convergence"]),
            )
        )
    if "resync" in parts:
        report["resync"] = overlay_resync.measure(cni_bin, args.peers, args.resync)
        sections.append(
            (f"resync, {args.peers} synthetic peers (vxlan)", resync_lines(report["resync"]))
        )
    return sections


def main(argv: list[str] | None = None) -> int:
    return run_sandboxed("overlay", parse_args(argv), run_parts, render)


if __name__ == "__main__":
    sys.exit(main())

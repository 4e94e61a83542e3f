"""`make bench-netpol`: NetworkPolicy's figures, each next to an anchor measured in
the same run on the same machine.

    python3 -m bench.netpol [--policies 1000] [--pods 10000] [--local 100] [--runs 3]
                            [--labels 30] [--changes 20] [--adds 150] [--connects 2000]
                            [--rounds 4]
                            [--svc-services 10000] [--remote-services 100]
                            [--timeout 900] [--settle 2] [--results-dir DIR]

Synthetic records (bench/netpol_records.py): ``--policies`` policies of four kinds over
``--pods`` Pods in 100 namespaces, ~``--local`` of them on the measured node. The figures and
their anchors:

(a) full sync: the first pass of a ``NetpolSync`` in a fresh netns, p50 of ``--runs``
    (bench/netpol_sync.py), against the Service proxy's full sync of ``--svc-services`` x 5
    (bench/svc_worker.py, ``nft -f -`` as pycnid runs a full render);
(b) policy change put in etcd -> node2's kernel, p50/p99 of ``--changes``, two pycnids on a
    real etcd, against the store-fed Service endpoint change on the same node2 before any
    policy, ``--remote-services`` x 5 (bench/netpol_remote.py);
(c) a Pod's labels changed -> the pass after it, p50 of ``--labels`` (half a Pod of this node,
    half of another node), against the Service proxy's one-Service update (libnftables);
(d) ADD cost: bridge + svc ADD, p50 of ``--adds`` pairs of an ADD enforcing 1,000 policies
    minus the neighbouring one on a second node not enforcing (the two in turn, the pair's
    Pods deleted after it), against the ADD not enforcing; beside it, the same difference in
    pycnid's own time serving the two requests (bench/netpol_node.py);
(e) first packet: TCP connects of ``--connects`` between two Pods of one bridge, with every
    policy minus with none: the p50 of each connect minus one made beside it to a twin
    server no policy selects, with the policies minus the same with none (the client's own
    speed moved each state's p50 by 10-20 µs between rounds); against the unpaired
    difference of the connects' p50s for the policies as a linear ruleset, where the twin
    walks every rule too (bench/netpol_linear.py);
(f) pycnid VmRSS enforcing minus not (same store, same records), against the one not enforcing.

A figure that fails is printed with why; the others are still measured. Results:
bench/results/netpol-<time>.json and netpol-latest.json, and a table. Only namespaces,
processes and directories this run creates are touched. Figures, never timed assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from . import netpol_node, netpol_remote
from . import netpol_records as records
from .common import (
    REPO,
    Line,
    Sandbox,
    median,
    percentile,
    python_env,
    render_goal_table,
    run_sandboxed,
)
from .svc import run_worker

RESULTS_DIR = os.path.join(REPO, "bench", "results")
#: The goals each figure is judged against.
GOALS = {
    "full_s": 1.0,
    "change_p50_ms": 10,
    "change_p99_ms": 50,
    "label_ms": 2,
    "add_ms": 2,
    "first_packet_us": 5,
    "rss_mib": 20,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.netpol", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--policies", type=int, default=1000, help="NetworkPolicies")
    add("--pods", type=int, default=10000, help="Pods in the cluster")
    add("--local", type=int, default=100, help="Pods on the measured node (about)")
    add("--runs", type=int, default=3, help="full syncs, each in a fresh netns")
    add("--labels", type=int, default=30, help="Pod label changes timed")
    add("--changes", type=int, default=20, help="policy changes timed across nodes")
    add("--adds", type=int, default=150, help="pairs of ADDs timed, enforcing and not")
    add("--connects", type=int, default=2000, help="TCP connects a first-packet figure")
    add("--rounds", type=int, default=4, help="first-packet states measured in turn")
    add("--svc-services", type=int, default=10000, help="Services of the proxy's anchor")
    add("--remote-services", type=int, default=100, help="Services of the cross-node anchor")
    add("--timeout", type=float, default=900.0, help="seconds to wait for a pycnid step")
    add("--settle", type=float, default=2.0, help="seconds before VmRSS is read")
    add("--no-change-wait", type=float, default=5.0, help=argparse.SUPPRESS)
    add("--results-dir", default=RESULTS_DIR)
    return parser.parse_args(argv)


def progress(text: str) -> None:
    print(f"--> {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def attempt(report: dict, key: str, fn: Callable[[], Any]) -> None:
    """``report[key] = fn()``; a failure is kept as ``{"error": why}`` and the run goes on."""
    try:
        report[key] = fn()
    except Exception as exc:  # one figure impossible: say why, measure the rest
        traceback.print_exc(file=sys.stderr)
        why = " ".join(str(exc).split())[:200]
        report[key] = {"error": f"{type(exc).__name__}: {why}"}


# --- (a), (c): NetpolSync in a fresh netns, the Service proxy's anchor ----------------------
def run_sync(box: Sandbox, args: argparse.Namespace, labels: int, run: int) -> dict:
    ns = box.netns(f"sync{run}")
    cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "bench.netpol_sync"]
    cmd += ["--policies", str(args.policies), "--pods", str(args.pods)]
    cmd += ["--local", str(args.local), "--labels", str(labels)]
    cmd += ["--no-change-wait", str(args.no_change_wait)]
    cmd += ["--store", os.path.join(box.workdir, f"sync{run}.db")]
    try:
        out = subprocess.run(cmd, cwd=REPO, env=python_env(), capture_output=True, text=True)
    finally:
        box.drop_namespaces([ns])
    if out.returncode != 0:
        raise RuntimeError(f"bench.netpol_sync: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout)


def measure_sync(box: Sandbox, args: argparse.Namespace) -> dict:
    runs = [run_sync(box, args, args.labels if r == 0 else 0, r) for r in range(args.runs)]
    labels = runs[0]["labels"]
    return {
        "full": [r["full"] for r in runs],
        "labels": labels,
        "records": runs[0]["records"],
    }


def measure_svc(box: Sandbox, args: argparse.Namespace) -> dict:
    full = run_worker(box, "pycni", "bin", args.svc_services, 0, "mixed")
    update = run_worker(box, "pycni", "lib", args.svc_services, 5, "mixed")
    rounds = [u["render"] + u["apply"] for u in update["updates"]]
    return {"full": full["render"] + full["apply"], "update": median(rounds)}


# --- the run -------------------------------------------------------------------------------
def measure(
    args: argparse.Namespace, box: Sandbox, cni_bin: str, report: dict
) -> list[tuple[str, list[Line]]]:
    sizes = records.Sizes(args.policies, args.pods, args.local, "node2")
    progress(f"(a), (c): full sync x {args.runs}, {args.labels} label changes")
    attempt(report, "sync", lambda: measure_sync(box, args))
    progress(f"anchor of (a), (c): the Service proxy at {args.svc_services} Services x 5")
    attempt(report, "svc", lambda: measure_svc(box, args))
    progress("(d), (e), (f): one pycnid, enforcing and not")
    attempt(report, "node", lambda: netpol_node.measure(box, cni_bin, sizes, args))
    progress(f"(b): {args.changes} policy changes across two nodes, and the Service anchor")
    attempt(
        report,
        "remote",
        lambda: netpol_remote.measure(sizes, args.remote_services, args.changes, args.timeout),
    )
    report["namespaces"] = [*box.namespaces, *report["remote"].get("namespaces", [])]
    report["namespace_prefix"] = box.prefix
    return build_sections(args, report)


# --- report --------------------------------------------------------------------------------
def ms(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1e3:.2f} ms" if abs(seconds) < 1 else f"{seconds:.2f} s"


def us(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e6:.1f} µs"


def mib(kib: float | None) -> str:
    return "—" if kib is None else f"{kib / 1024:.1f} MiB"


def ratio(ours: float | None, anchor: float | None) -> str:
    if ours is None or not anchor:
        return ""
    value = ours / anchor
    return f"{value:.2f}x" if abs(value) < 100 else f"{value:.0f}x"


def verdict(value: float | None, limit: float) -> str:
    return "n/a" if value is None else ("PASS" if value <= limit else "MISS")


def line(label: str, ours: float | None, anchor: float | None, show, goal: str, limit) -> Line:
    """A figure: ours, the anchor, ours/anchor, the goal and PASS/MISS (limit None: info)."""
    result = "" if limit is None else verdict(ours, limit)
    return (label, show(ours), show(anchor), ratio(ours, anchor), goal, result)


def failed(label: str, part: dict) -> list[Line]:
    return [(label, "failed", "", "", "", part["error"])]


def sync_lines(sync: dict, svc: dict, sizes: str, services: int) -> list[Line]:
    label = f"(a) full sync, {sizes}, p50 of {len(sync.get('full', []))}"
    if "error" in sync:
        return failed(label, sync)
    anchor = svc.get("full")
    return [
        line(label, median(sync["full"]), anchor, ms, f"<={GOALS['full_s']:g} s", GOALS["full_s"]),
        (f"  anchor: Service proxy full sync, {services:,} x 5", "", "", "", "", ""),
    ]


def label_lines(sync: dict, svc: dict, services: int) -> list[Line]:
    if "error" in sync:
        return failed("(c) Pod label change -> pass", sync)
    anchor, limit, goal = svc.get("update"), GOALS["label_ms"] / 1e3, f"<={GOALS['label_ms']} ms"
    out = []
    for local, where in ((True, "this node's Pod"), (False, "another node's Pod")):
        rows = [r["seconds"] for r in sync["labels"] if r["local"] == local]
        timed = [s for s in rows if s is not None]
        label = f"(c) label change, {where}, p50 of {len(timed)}"
        out.append(line(label, median(timed) if timed else None, anchor, ms, goal, limit))
        if len(timed) < len(rows):
            out.append(
                (f"  {len(rows) - len(timed)} changed no table: no pass", "", "", "", "", "")
            )
    out.append((f"  anchor: Service proxy one-Service update at {services:,}", "", "", "", "", ""))
    return out


def remote_lines(remote: dict, services: int) -> list[Line]:
    if "error" in remote:
        return failed("(b) policy change -> other node's kernel", remote)
    fig, anchor = remote["figure"], remote["anchor"]
    n = len(fig["runs"])
    p99 = percentile([r for r in _times(fig) if r is not None], 99) if _times(fig) else None
    anchor_p99 = percentile(_times(anchor), 99) if _times(anchor) else None
    return [
        line(
            f"(b) policy change -> node2's kernel, p50 of {n}",
            fig["p50"],
            anchor["p50"],
            ms,
            f"<={GOALS['change_p50_ms']} ms",
            GOALS["change_p50_ms"] / 1e3,
        ),
        line(
            "    p99",
            p99,
            anchor_p99,
            ms,
            f"<={GOALS['change_p99_ms']} ms",
            GOALS["change_p99_ms"] / 1e3,
        ),
        (
            f"  node2's passes after a store change (its log), p50 of {len(fig['passes'])}",
            ms(p50(fig["passes"])),
            *("", "", "", ""),
        ),
        (
            "    begun after the store change they read reached node2, p50",
            ms(p50(fig["begun_after"])),
            *("", "", "", ""),
        ),
        (
            "  timed once node2's pycnid was idle, after its render of every policy",
            "never" if fig.get("idle_after") is None else f"{fig['idle_after']:.1f} s",
            *("", "", "", ""),
        ),
        (f"  timed out: {fig['timeouts']} (anchor {anchor['timeouts']})", "", "", "", "", ""),
        (f"  anchor: Service endpoint change, same node2, {services:,} x 5", "", "", "", "", ""),
    ]


def _times(figures: dict) -> list[float]:
    return [r["put_to_programmed"] for r in figures["runs"] if r["put_to_programmed"] is not None]


def node_lines(node: dict) -> list[Line]:
    if "error" in node:
        return failed("(d), (e), (f) one pycnid node", node)
    on, off, fp = node["on"], node["off"], node["first_packet"]
    both = zip(on["adds"]["seconds"], off["adds"]["seconds"], strict=True)
    pairs = [(a, b) for a, b in both if a is not None and b is not None]
    add_on, add_off = p50([a for a, _ in pairs]), p50([b for _, b in pairs])
    failures = [*on["adds"]["failed"], *off["adds"]["failed"]]
    rss_on, rss_off = on["rss_kib"], off["rss_kib"]
    packet = fp["policies"]["paired"] - fp["none"]["paired"]
    linear = fp["linear"]["p50"] - fp["none"]["p50"]
    return [
        line(
            f"(d) ADD cost of isolating, p50 of {len(pairs)} pairs",
            p50([a - b for a, b in pairs]),
            add_off,
            ms,
            f"<=+{GOALS['add_ms']} ms",
            GOALS["add_ms"] / 1e3,
        ),
        line("  ADD enforcing / the anchor node (bridge + svc)", add_on, add_off, ms, "", None),
        *served_lines(on["adds"], off["adds"]),
        *failure_lines(failures, len(on["adds"]["failed"])),
        line(
            f"(e) first packet, policies vs 0, paired with the twin, p50 of {fp['policies']['n']}",
            packet,
            linear,
            us,
            f"<=+{GOALS['first_packet_us']} µs",
            GOALS["first_packet_us"] / 1e6,
        ),
        line(
            "  server minus twin beside it, p50: with policies / with 0",
            fp["policies"]["paired"],
            fp["none"]["paired"],
            us,
            "",
            None,
        ),
        line(
            "  connect, unpaired: with policies / with 0",
            fp["policies"]["p50"],
            fp["none"]["p50"],
            us,
            "",
            None,
        ),
        line(
            "  the twin (no policy selects it): with policies / with 0",
            fp["policies"]["twin"]["p50"],
            fp["none"]["twin"]["p50"],
            us,
            "",
            None,
        ),
        line(
            "  connect: linear rules / with 0",
            fp["linear"]["p50"],
            fp["none"]["p50"],
            us,
            "",
            None,
        ),
        round_lines(fp),
        (f"  anchor: linear ruleset, {fp['linear_rules']} rules", "", "", "", "", ""),
        line(
            "(f) pycnid VmRSS enforcing minus not",
            None if rss_on is None or rss_off is None else rss_on - rss_off,
            rss_off,
            mib,
            f"<=+{GOALS['rss_mib']} MiB",
            GOALS["rss_mib"] * 1024,
        ),
        line("  VmRSS enforcing / not", rss_on, rss_off, mib, "", None),
        ("  first render after start", secs(on["start_to_programmed"]), "", "", "", ""),
    ]


def round_lines(fp: dict) -> Line:
    """Each round's p50 with the policies minus its p50 with none, unpaired (the order of the
    states reversed every other round, bench/netpol_node.py): how much that moves."""
    both = zip(fp["policies"]["rounds"], fp["none"]["rounds"], strict=True)
    each = " ".join(f"{(a - b) * 1e6:+.1f}" for a, b in both)
    return (f"  each round unpaired, policies minus 0 (µs): {each}", "", "", "", "", "")


def served_lines(on: dict, off: dict) -> list[Line]:
    """The pairs' difference in pycnid's own time serving the ADD's requests (its log), beside
    the whole ADD's: the ADDs' executables are the same on the two nodes, and their start
    (~40 ms of Python) moves each ADD by a few ms, pycnid's part by less."""
    out = []
    for key, name in (("served_ms", "bridge + svc"), ("svc_ms", "svc alone")):
        both = zip(on.get(key, ()), off.get(key, ()), strict=True)
        pairs = [(a / 1e3, b / 1e3) for a, b in both if a is not None and b is not None]
        diffs = [a - b for a, b in pairs]
        label = f"  pycnid serving it ({name}), p50 of {len(pairs)} pairs' differences"
        out.append(line(label, p50(diffs), p50([b for _, b in pairs]), ms, "", None))
    return out


def p50(values: list[float]) -> float | None:
    return median(values) if values else None


def failure_lines(failures: list[str], enforcing: int) -> list[Line]:
    if not failures:
        return []
    head = f"  ADDs failed: {len(failures)} ({enforcing} enforcing), the first {failures[0]}"
    return [(head, "", "", "", "", "")]


def secs(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds:.2f} s"


def build_sections(args: argparse.Namespace, report: dict) -> list[tuple[str, list[Line]]]:
    sizes = f"{args.policies:,} policies x {args.pods:,} Pods (~{args.local} local)"
    sync, svc = report["sync"], report["svc"]
    svc = {} if "error" in svc else svc
    return [
        (
            f"NetworkPolicy at {sizes}; ratio = pycni / anchor",
            [
                *sync_lines(sync, svc, sizes, args.svc_services),
                *remote_lines(report["remote"], args.remote_services),
                *label_lines(sync, svc, args.svc_services),
                *node_lines(report["node"]),
            ],
        )
    ]


def render(report: dict, sections: list[tuple[str, list[Line]]]) -> str:
    return render_goal_table("bench-netpol", report, sections, "anchor", (14, 14))


def main(argv: list[str] | None = None) -> int:
    return run_sandboxed("netpol", parse_args(argv), measure, render)


if __name__ == "__main__":
    sys.exit(main())

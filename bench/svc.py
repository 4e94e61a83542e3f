"""`make bench-svc`: loading Service rulesets, pycni's proxy against the kube-proxy shape.

    python3 -m bench.svc [--sizes 1000,10000,30000] [--update-at 10000] [--updates 5]
                         [--engines lib,bin] [--kube-max 10000] [--mix mixed|mixed-2aff|clusterip]
                         [--repeats 3] [--results-dir DIR]

Every Service has 5 endpoints. The Services are a mix (bench/svc_shapes.py), per 100: 5
LoadBalancer (an ingress IP and a nodePort each, 2 with loadBalancerSourceRanges), 10 NodePort,
5 of those 15 with externalTrafficPolicy Local (2 endpoints on this node, 3 on others), 5 with
sessionAffinity ClientIP, 80 plain ClusterIP; ``--mix mixed-2aff`` keeps 2 of the 5 affinity
Services; ``--mix clusterip`` makes them all ClusterIP with Cluster policy (the bench before
the mix, kept for comparison: it costs a flag). For each size,
shape and engine (lib = one kept libnftables context, as pycnid runs it; bin = `nft -f -`, as
kube-proxy runs it) a fresh netns and a fresh process (bench/svc_worker.py) time the full sync
as one transaction; at --update-at, --updates one-Service updates (one endpoint of one Service
changed: with the mix a LoadBalancer with externalTrafficPolicy Local and source ranges, its
local endpoint swapped) on each shape. pycni's runs are made --repeats times, each in a fresh
netns and process: its full sync is the run of the median time (one load varied by 0.5 s
between runs minutes apart on this 2-core machine), its updates those of every run. The
kube-proxy shape loads once (200 s at 10k). pycni's times are a whole proxy pass as pycnid runs it
(``services.proxy.sync.calc_plan`` over the store records the proxy holds: the Services' views,
the table's plan and script, the commit); the kube-proxy shape's count only nft's load (its Go
generator is not measured), which favours kube-proxy. Endpoints are spread over 100 nodes (1 in
100 local to the measured node; 2 of 5 under a Local policy), which changes pycni's hairpin set
and the Local policy's backends: kube-proxy renders its hairpin rule in every endpoint chain.

The kube-proxy shape above --kube-max is skipped (its load time grows faster than the number of
Services: 30k would take many minutes): pass --kube-max 30000 to run it. Goals at 10k × 5: full
sync <= 1 s, update <= 5 ms, >= 30x faster than the kube-proxy shape on both. Prints a table and
writes JSON to bench/results/ (svc-<time>.json, svc-latest.json). Only namespaces this run creates
are touched; never used as timed assertions in the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from .common import REPO, Line, Sandbox, median, python_env, render_goal_table, run_sandboxed
from .svc_shapes import MIX_LABELS, MIX_TAGS, MIXES

RESULTS_DIR = os.path.join(REPO, "bench", "results")
ENGINES = {"lib": "libnftables", "bin": "nft -f -"}
#: The engine pycnid runs each kind with: a full render in a child nft -f - (Nft.run_apart),
#: an update through its kept libnftables context. The goal lines are measured with it.
PYCNID_ENGINE = {"full": "bin", "update": "lib"}
GOALS = {"full": 1.0, "update": 0.005, "ratio": 30.0}
VERIFY_MAX = 2000  # read the dispatch map back up to this size (listing layout A is slow)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.svc", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,30000", help="Service counts")
    parser.add_argument("--update-at", type=int, default=10000, help="size of the update runs")
    parser.add_argument("--updates", type=int, default=5, help="one-Service updates a run")
    parser.add_argument("--engines", default="lib,bin")
    parser.add_argument(
        "--kube-max", type=int, default=10000, help="largest size loaded in the kube-proxy shape"
    )
    parser.add_argument(
        "--mix", choices=MIXES, default="mixed", help="the Services' features (see above)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="pycni runs per size and engine (the median's)"
    )
    parser.add_argument("--results-dir", default=RESULTS_DIR)
    return parser.parse_args(argv)


def run_worker(box: Sandbox, shape: str, engine: str, size: int, updates: int, mix: str) -> dict:
    """One (shape, engine, size) in its own netns, deleted afterwards."""
    ns = box.netns(f"{shape}-{engine}-{size}")
    cmd = [
        "ip",
        "netns",
        "exec",
        ns,
        sys.executable,
        "-m",
        "bench.svc_worker",
        "--shape",
        shape,
        "--engine",
        engine,
        "--services",
        str(size),
        "--updates",
        str(updates),
        "--mix",
        mix,
    ]
    cmd += ["--verify"] if size <= VERIFY_MAX else []
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=1800
        )
    finally:
        box.drop_namespaces([ns])
    if proc.returncode != 0:
        raise RuntimeError(f"{shape}/{engine}/{size}: {proc.stderr.strip()[-2000:]}")
    result = json.loads(proc.stdout)
    held, wanted = result.get("service_ips_in_kernel"), result.get("service_ips_expected")
    if held != wanted:
        raise RuntimeError(
            f"{shape}/{engine}/{size}: the kernel holds {held} of {wanted} dispatch elements"
        )
    return result


def measure_runs(args: argparse.Namespace, box: Sandbox) -> dict[str, dict]:
    sizes = [int(s) for s in args.sizes.split(",") if s]
    engines = [e for e in args.engines.split(",") if e]
    runs = {}
    for shape in ("pycni", "kube"):
        for size in sizes:
            if shape == "kube" and size > args.kube_max:
                continue
            for engine in engines:
                updates = args.updates if size == args.update_at else 0
                repeats = max(1, args.repeats) if shape == "pycni" else 1
                made = [
                    run_worker(box, shape, engine, size, updates, args.mix) for _ in range(repeats)
                ]
                runs[f"{shape}/{engine}/{size}"] = calc_median_run(made)
                print(f"  {shape:5} {ENGINES[engine]:11} {size:>6,} Services loaded", flush=True)
    return runs


def calc_median_run(made: list[dict]) -> dict:
    """Runs of one (shape, engine, size) as one: the run whose full sync took the median time
    (the lower middle of an even count), with every run's full sync time and update rounds."""
    ranked = sorted(made, key=full_seconds)
    chosen = ranked[(len(ranked) - 1) // 2]
    rounds = [u for run in made for u in run.get("updates") or []]
    return {**chosen, "full_runs": [full_seconds(run) for run in made], "updates": rounds}


def full_seconds(run: dict) -> float:
    """pycni: render + apply (what pycnid spends); kube-proxy shape: nft's load only."""
    return run["apply"] + (run["render"] if "elements" in run else 0.0)


def update_seconds(run: dict) -> float | None:
    rounds = run.get("updates") or []
    if not rounds:
        return None
    extra = (lambda u: u["render"]) if "elements" in run else (lambda u: 0.0)
    return median([u["apply"] + extra(u) for u in rounds])


def ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value * 1000:.2f} ms" if value < 0.1 else f"{value:.2f} s"


def verdict(ok: bool | None) -> str:
    return "" if ok is None else ("PASS" if ok else "MISS")


def ratio(kube: float | None, pycni: float | None) -> float | None:
    return kube / pycni if kube and pycni else None


def best_kube(runs: dict, size: int, metric) -> tuple[float | None, str]:
    """kube-proxy shape's fastest engine at ``size`` (the fairest comparison for it)."""
    found = [
        (metric(r), k.split("/")[1])
        for k, r in runs.items()
        if k.startswith("kube/") and k.endswith(f"/{size}") and metric(r) is not None
    ]
    return min(found) if found else (None, "")


def goal_rows(runs: dict, size: int, kind: str, mix: str) -> list[dict]:
    """The two goal lines of a kind (full | update) at ``size``: absolute and ratio."""
    metric = full_seconds if kind == "full" else update_seconds
    engine_used = PYCNID_ENGINE[kind]
    run = runs.get(f"pycni/{engine_used}/{size}")
    mine = metric(run) if run else None
    kube, engine = best_kube(runs, size, metric)
    r = ratio(kube, mine)
    label = (
        f"full sync ({_runs(run)})"
        if kind == "full"
        else f"one-Service update (median of {args_updates(run)})"
    )
    return [
        {
            "label": f"{size:,} {MIX_TAGS[mix]} Services: pycni {label}, {ENGINES[engine_used]}",
            "pycni": mine,
            "goal": f"<={ms(GOALS[kind])}",
            "verdict": verdict(None if mine is None else mine <= GOALS[kind]),
        },
        {
            "label": f"  vs kube-proxy shape ({ENGINES.get(engine, '—')}, its faster)",
            "pycni": mine,
            "kube": kube,
            "ratio": r,
            "goal": f">={GOALS['ratio']:.0f}x",
            "verdict": verdict(None if mine is None or kube is None else r >= GOALS["ratio"]),
        },
        _apply_row(run, kube, kind),
    ]


def _apply_row(run: dict | None, kube: float | None, kind: str) -> dict:
    """Info: nft's share of pycni's time (the transaction alone), against the same kube time."""
    if not run or (kind == "update" and not run.get("updates")):
        return {"label": "  nft's share only (info)", "goal": "", "verdict": ""}
    apply = run["apply"] if kind == "full" else median([u["apply"] for u in run["updates"]])
    return {
        "label": "  nft's share only: the transaction (info)",
        "pycni": apply,
        "kube": kube,
        "ratio": ratio(kube, apply),
        "goal": "",
        "verdict": "",
    }


def _runs(run: dict | None) -> str:
    count = len(run["full_runs"]) if run else 1
    return "one run" if count == 1 else f"median of {count} runs"


def args_updates(run: dict | None) -> int:
    return len(run.get("updates") or []) if run else 0


def info_lines(runs: dict, sizes: list[int]) -> list[Line]:
    """Every run: full sync, its render/apply split, and the update's, per engine."""
    lines: list[Line] = []
    for size in sizes:
        for engine, name in ENGINES.items():
            mine, kube = runs.get(f"pycni/{engine}/{size}"), runs.get(f"kube/{engine}/{size}")
            if not mine and not kube:
                continue
            p, k = full_seconds(mine) if mine else None, full_seconds(kube) if kube else None
            lines.append(
                (
                    f"{size:,} x 5, full sync, {name}",
                    ms(p),
                    ms(k) if kube else "skipped",
                    _x(ratio(k, p)),
                    "",
                    "",
                )
            )
            if mine:
                lines.append(
                    (
                        "  pycni: render (Python) + apply (nft)",
                        f"{ms(mine['render'])} + {ms(mine['apply'])}",
                        "",
                        "",
                        "",
                        "",
                    )
                )
                if len(mine["full_runs"]) > 1:
                    each = " / ".join(ms(t) for t in mine["full_runs"])
                    lines.append(("  pycni: each run, in order", each, "", "", "", ""))
            lines += _update_lines(mine, kube)
    return lines


def _update_lines(mine: dict | None, kube: dict | None) -> list[Line]:
    p, k = update_seconds(mine) if mine else None, update_seconds(kube) if kube else None
    if p is None and k is None:
        return []
    render = median([u["render"] for u in mine["updates"]]) if p is not None else None
    apply = median([u["apply"] for u in mine["updates"]]) if p is not None else None
    return [
        ("  one-Service update, median", ms(p), ms(k), _x(ratio(k, p)), "", ""),
        (
            "    pycni: render (Python) + apply (nft)",
            f"{ms(render)} + {ms(apply)}",
            "",
            "",
            "",
            "",
        ),
    ]


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}x"


def rss_lines(runs: dict, size: int) -> list[Line]:
    run = runs.get(f"pycni/lib/{size}")
    if not run:
        return []
    base, built, synced = (
        run[k] or 0 for k in ("rss_kib_base", "rss_kib_built", "rss_kib_synced")
    )
    return [
        (
            f"VmRSS, Python holding the {size:,}-Service model",
            f"{built / 1024:.0f} MiB",
            "",
            "",
            "",
            f"(imports only: {base / 1024:.0f} MiB)",
        ),
        (
            "  after the full sync (context, allocator high-water)",
            f"{synced / 1024:.0f} MiB",
            "",
            "",
            "",
            "",
        ),
    ]


def as_line(row: dict) -> Line:
    return (
        row["label"],
        ms(row.get("pycni")),
        ms(row["kube"]) if "kube" in row else "",
        _x(row.get("ratio")),
        row["goal"],
        row["verdict"],
    )


def render(report: dict, sections: list[tuple[str, list[Line]]]) -> str:
    return render_goal_table("bench-svc", report, sections, "kube-proxy", (22, 12))


def build_sections(args: argparse.Namespace, report: dict) -> list[tuple[str, list[Line]]]:
    runs, at = report["runs"], args.update_at
    report["goals"] = goal_rows(runs, at, "full", args.mix) + goal_rows(
        runs, at, "update", args.mix
    )
    sizes = [int(s) for s in args.sizes.split(",") if s]
    return [
        (
            f"goals at {at:,} Services x 5 endpoints, {MIX_LABELS[args.mix]}",
            [as_line(r) for r in report["goals"]],
        ),
        (
            "every run (kube-proxy shape: nft's load only; pycni: render + load)",
            info_lines(runs, sizes),
        ),
        ("memory (this process; pycnid's own: make bench-svc-e2e)", rss_lines(runs, at)),
    ]


def measure(
    args: argparse.Namespace, box: Sandbox, _cni_bin: str, report: dict
) -> list[tuple[str, list[Line]]]:
    report["runs"] = measure_runs(args, box)
    return build_sections(args, report)  # it also puts the goal rows into the report


def main(argv: list[str] | None = None) -> int:
    return run_sandboxed("svc", parse_args(argv), measure, render)


if __name__ == "__main__":
    sys.exit(main())

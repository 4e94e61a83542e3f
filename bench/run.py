"""`make bench`: pycni side by side with the reference Go bridge + host-local, in one run.

    python3 -m bench.run [--pods 50] [--churn 200] [--concurrency 8] [--rounds 200] [--no-masq]

Prints a table (goal and PASS/MISS per line) and writes the figures as JSON to bench/results/.
Figures are wall-clock times as a runtime sees them (fork+exec+answer). Never used as timed
assertions in the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from . import exe_overhead
from .common import (
    REPO,
    Sandbox,
    median,
    percentile,
    reference_version,
    report_header,
    write_launchers,
)
from .report import Row, render_table
from .sides import Side, pycni_side, reference_side

RESULTS_DIR = os.path.join(REPO, "bench", "results")
CPU_KEYS = ("add_cpu", "add_daemon_cpu", "del_cpu", "del_daemon_cpu")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50, help="fresh pods for ADD/DEL latency")
    parser.add_argument("--churn", type=int, default=200, help="pods in the churn run")
    parser.add_argument("--concurrency", type=int, default=8, help="churn concurrency")
    parser.add_argument("--results-dir", default=RESULTS_DIR, help="where the JSON goes")
    parser.add_argument(
        "--chunks", type=int, default=5, help="latency blocks, alternating between the sides"
    )
    parser.add_argument("--rounds", type=int, default=200, help="VERSION exec rounds")
    parser.add_argument(
        "--masq",
        choices=("on", "off", "both"),
        default="both",
        help="ipMasq on both sides: on (as the example conflist), off, or both runs",
    )
    return parser.parse_args(argv)


def latency(
    box: Sandbox, sides: list[Side], count: int, chunks: int, failed: dict[str, str]
) -> dict[str, dict]:
    """A warm-up pod per side (makes the bridge), then `count` fresh pods per side, ADD each
    then DEL each, in `chunks` blocks that alternate between the sides so that background load
    on the machine falls on both alike."""
    merged = {
        side.name: {
            "add": [],
            "del": [],
            "errors": [],
            "error_count": 0,
            "ips": 0,
            "unique_ips": 0,
            **dict.fromkeys(CPU_KEYS, 0.0),
        }
        for side in sides
    }
    for side in sides:
        drive_fresh(box, side, f"{side.name[:3]}w", 1, 1, failed)
    sizes = [count // chunks + (1 if i < count % chunks else 0) for i in range(chunks)]
    for i, size in enumerate(s for s in sizes if s):
        for side in sides if i % 2 == 0 else sides[::-1]:
            out = drive_fresh(box, side, f"{side.name[:3]}l{i}-", size, 1, failed)
            if out:
                merge(merged[side.name], out)
    return {
        name: {**m, **stats(m["add"], "add"), **stats(m["del"], "del"), **cpu_per_pod(m)}
        for name, m in merged.items()
        if name not in failed
    }


def cpu_per_pod(m: dict) -> dict:
    """CPU seconds per pod: the plugin processes (with their children) plus pycnid's share."""
    pods = len(m["add"])
    if not pods or m["error_count"]:
        return {"add_cpu_per_pod": None, "del_cpu_per_pod": None}
    return {
        "add_cpu_per_pod": (m["add_cpu"] + m["add_daemon_cpu"]) / pods,
        "del_cpu_per_pod": (m["del_cpu"] + m["del_daemon_cpu"]) / pods,
    }


def drive_fresh(
    box: Sandbox, side: Side, label: str, count: int, concurrency: int, failed: dict[str, str]
) -> dict | None:
    """ADD then DEL `count` fresh pods on one side; a driver crash marks the side failed."""
    if side.name in failed:
        return None
    pods = box.pods(label, count)
    try:
        return side.drive(box, pods, concurrency)
    except RuntimeError as exc:
        failed[side.name] = str(exc)
        return None
    finally:
        box.drop_namespaces(pods)


def merge(into: dict, out: dict) -> None:
    into["add"] += out["add"]
    into["del"] += out["del"]
    into["errors"] = (into["errors"] + out["errors"])[:5]
    for key in ("error_count", "ips", "unique_ips", *CPU_KEYS):
        into[key] += out[key]


def churn(
    box: Sandbox, side: Side, count: int, concurrency: int, failed: dict[str, str]
) -> dict | None:
    out = drive_fresh(box, side, f"{side.name[:3]}c", count, concurrency, failed)
    if out is None:
        return None
    if out["error_count"]:  # a wall time with failed pods in it compares nothing
        out["add_wall"] = out["del_wall"] = None
    out["wall"] = None if out["error_count"] else out["add_wall"] + out["del_wall"]
    out["cpu"] = sum(out[key] for key in CPU_KEYS)
    out["rss_kib"] = side.rss_kib()
    out["residue"] = side.residue()
    return {k: v for k, v in out.items() if k not in ("add", "del")}


def stats(values: list[float], prefix: str) -> dict:
    if not values:
        return {f"{prefix}_p50": None, f"{prefix}_p99": None}
    return {f"{prefix}_p50": median(values), f"{prefix}_p99": percentile(values, 99)}


def exec_rows(exe: dict) -> list[Row]:
    bare, ours = exe["python -I -S -c pass"]["median"], exe["pycni-bridge VERSION"]["median"]
    return [
        Row("exec VERSION median (vs python -I -S -c pass)", ours, bare, 2.0, "ms"),
        Row(
            "  Go bridge VERSION median (info)",
            exe["go bridge VERSION"]["median"],
            None,
            None,
            "ms",
        ),
    ]


def variant_rows(pycni: dict, ref: dict, args: argparse.Namespace) -> list[Row]:
    rows = []
    lat_p, lat_r = pycni.get("latency") or {}, ref.get("latency") or {}
    for verb, goal in (("add", 1.5), ("del", 1.0)):
        for pct in ("p50", "p99"):
            key = f"{verb}_{pct}"
            rows.append(
                Row(
                    f"{verb.upper()} {pct} over {args.pods} fresh pods",
                    lat_p.get(key),
                    lat_r.get(key),
                    goal,
                    "ms",
                )
            )
    for verb in ("add", "del"):
        rows.append(
            Row(
                f"  {verb.upper()} CPU per pod, exec + pycnid (info)",
                lat_p.get(f"{verb}_cpu_per_pod"),
                lat_r.get(f"{verb}_cpu_per_pod"),
                None,
                "ms",
            )
        )
    ch_p, ch_r = pycni.get("churn") or {}, ref.get("churn") or {}
    rows.append(
        Row(
            f"churn {args.churn} pods @{args.concurrency} (ADD all + DEL all)",
            ch_p.get("wall"),
            ch_r.get("wall"),
            1.0,
            "s",
        )
    )
    rows.append(
        Row("  churn ADD phase (info)", ch_p.get("add_wall"), ch_r.get("add_wall"), None, "s")
    )
    rows.append(
        Row("  churn DEL phase (info)", ch_p.get("del_wall"), ch_r.get("del_wall"), None, "s")
    )
    rows.append(
        Row("  churn CPU, exec + pycnid (info)", ch_p.get("cpu"), ch_r.get("cpu"), None, "s")
    )
    rss = ch_p.get("rss_kib")
    rows.append(
        Row("pycnid VmRSS after churn (info)", rss / 1024 if rss else None, None, None, "MiB")
    )
    return rows


def save(report: dict, directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = os.path.join(directory, f"bench-{stamp}.json")
    for target in (path, os.path.join(directory, "latest.json")):
        with open(target, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2, sort_keys=True)
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench: needs root (it makes network namespaces)")
    started = time.monotonic()
    variants = {"on": [True], "off": [False], "both": [True, False]}[args.masq]
    report: dict = {
        **report_header({"isGateway": True, **vars(args)}),
        "reference": f"containernetworking-plugins {reference_version()}",
        "variants": {},
    }
    with Sandbox() as box:
        report["sandbox"] = {"prefix": box.prefix, "workdir": box.workdir}
        bin_dir = write_launchers(os.path.join(box.workdir, "bin"))
        print(f"--> exec overhead: {args.rounds} interleaved rounds", file=sys.stderr, flush=True)
        report["exec"] = exe_overhead.measure(bin_dir, args.rounds)
        sections = [("", exec_rows(report["exec"]))]
        for masq in variants:
            pycni, ref = measure_variant(box, bin_dir, masq, args)
            rows = variant_rows(pycni, ref, args)
            title = (
                f"ipMasq={str(masq).lower()} (isGateway=true, host-local dataDir in a temp dir)"
            )
            sections.append((title, rows))
            report["variants"][f"ipMasq={str(masq).lower()}"] = {
                "pycni": pycni,
                "reference": ref,
                "rows": [row.as_dict() for row in rows],
            }
    report["exec_rows"] = [row.as_dict() for row in sections[0][1]]
    report["seconds"] = round(time.monotonic() - started, 1)
    report["machine"]["loadavg_end"] = round(os.getloadavg()[0], 1)
    print(render_table(report, sections))
    for name, variant in report["variants"].items():
        for side in ("pycni", "reference"):
            residue = variant[side].get("churn", {}).get("residue")
            if residue:
                print(
                    f"  [{name}] {side}: left in the node namespace after all DELs: "
                    + ", ".join(f"{k}={v}" for k, v in residue.items())
                )
            for problem in side_problems(variant[side]):
                print(f"  [{name}] {side}: {problem}")
    saved = os.path.relpath(save(report, args.results_dir), REPO)
    print(f"results: {saved}  ({report['seconds']:.0f} s)")
    return 0


def measure_variant(
    box: Sandbox, bin_dir: str, masq: bool, args: argparse.Namespace
) -> tuple[dict, dict]:
    """Both sides under one config: latency blocks interleaved, then churn (reference first)."""
    tag = "m" if masq else "n"
    print(
        f"--> ipMasq={str(masq).lower()}: {args.pods} fresh pods a side ADD/DEL, then "
        f"{args.churn} pods at concurrency {args.concurrency}",
        file=sys.stderr,
        flush=True,
    )
    failed: dict[str, str] = {}
    sides = [reference_side(box, masq, tag)]
    try:
        sides.append(pycni_side(box, masq, bin_dir, tag))
    except RuntimeError as exc:  # pycnid did not start
        failed["pycni"] = str(exc)
    try:
        lat = latency(box, sides, args.pods, args.chunks, failed)
        results = {
            side.name: {
                "latency": lat.get(side.name, {}),
                "churn": churn(box, side, args.churn, args.concurrency, failed),
            }
            for side in sides
        }
    finally:
        for side in sides:
            side.stop()
    for name, why in failed.items():
        results[name] = {"failed": why}
    return results.get("pycni", {}), results["reference"]


def side_problems(side: dict) -> list[str]:
    if "failed" in side:
        return [f"failed: ...{side['failed'][-600:]}"]
    problems = []
    for phase in ("latency", "churn"):
        part = side.get(phase) or {}
        if part.get("error_count"):
            problems.append(f"{phase}: {part['error_count']} errors, e.g. {part['errors'][:2]}")
        if part.get("ips", 0) != part.get("unique_ips", 0):
            problems.append(f"{phase}: duplicate IPs handed out")
    return problems


if __name__ == "__main__":
    sys.exit(main())

"""What `make soak` measures of each pycnid over the run, and the figures it prints.

A sampler thread reads every pycnid's VmRSS (bench/common.py) and its open fds (the entries of
/proc/PID/fd) every few seconds; the figures are each series' first and last value and its
least-squares slope per hour, the ADD p99 of each minute, the ADD/DEL counts, every distinct
error and `pycni doctor`'s verdict on every node.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from tests.fixtures.cluster import ClusterNode

from .common import Line, percentile, vm_rss_kib
from .soak_churn import Tally


@dataclass
class Series:
    """(seconds since start, value) samples of one figure of one pycnid."""

    points: list[tuple[float, float]] = field(default_factory=list)

    def summary(self) -> dict:
        values = [v for _, v in self.points]
        return {
            "start": values[0] if values else None,
            "end": values[-1] if values else None,
            "per_hour": calc_slope(self.points) * 3600.0 if len(self.points) > 1 else None,
            "samples": len(values),
            "points": [[round(t, 1), v] for t, v in self.points],  # for a plot of the run
        }


def calc_slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of value over seconds (0 when every sample has the same time)."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


@dataclass
class Sampler:
    """VmRSS (KiB) and open fds of each node's pycnid, every ``every`` seconds."""

    nodes: list[ClusterNode]
    every: float
    started: float = field(default_factory=time.monotonic)
    rss: dict[str, Series] = field(default_factory=dict)
    fds: dict[str, Series] = field(default_factory=dict)

    def sample(self) -> None:
        at = time.monotonic() - self.started
        for node in self.nodes:
            pid = node.daemon.proc.pid if node.daemon.proc else 0
            for series, value in ((self.rss, vm_rss_kib(pid)), (self.fds, open_fds(pid))):
                if value is not None:
                    series.setdefault(node.name, Series()).points.append((at, float(value)))

    def run(self, stop: threading.Event) -> None:
        """Samples until ``stop``; the caller takes the last once the churn has drained, so
        the first and the last sample both see no request in flight."""
        while not stop.is_set():
            self.sample()
            stop.wait(self.every)

    def summary(self) -> dict:
        return {
            name: {"rss_kib": self.rss[name].summary(), "fds": self.fds[name].summary()}
            for name in self.rss
        }


def calc_minutes(adds: list[tuple[float, float]]) -> list[dict]:
    """ADD count and p99 (seconds) per minute of the run, from (since start, seconds)."""
    minutes: dict[int, list[float]] = {}
    for at, seconds in adds:
        minutes.setdefault(int(at // 60), []).append(seconds)
    return [
        {"minute": m + 1, "adds": len(v), "p99": percentile(v, 99)}
        for m, v in sorted(minutes.items())
    ]


def tally_summary(tally: Tally) -> dict:
    with tally.lock:
        return {
            "counts": dict(tally.counts),
            "add_per_minute": calc_minutes(list(tally.adds)),
            "errors": dict(tally.errors),
        }


# --- lines ---------------------------------------------------------------------------------
def mib(kib: float | None) -> str:
    return "—" if kib is None else f"{kib / 1024:.1f} MiB"


def number(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def slope(value: float | None, unit: str, scale: float = 1.0) -> str:
    return "—" if value is None else f"{value / scale:+.1f} {unit}/h"


def daemon_lines(name: str, figures: dict) -> list[Line]:
    rss, fds = figures["rss_kib"], figures["fds"]
    return [
        (f"{name} pycnid VmRSS", mib(rss["start"]), mib(rss["end"]), "", "", ""),
        ("  slope", slope(rss["per_hour"], "MiB", 1024), "", "", "", ""),
        (f"{name} pycnid open fds", number(fds["start"]), number(fds["end"]), "", "", ""),
        ("  slope", slope(fds["per_hour"], "fds"), "", "", "", ""),
    ]


def add_lines(counts: dict, minutes: list[dict]) -> list[Line]:
    lines: list[Line] = [
        (f"ADD p99, minute {m['minute']} ({m['adds']} ADDs)", f"{m['p99'] * 1000:.0f} ms")
        + ("",) * 4
        for m in minutes
    ]
    for what in ("ADD", "DEL", "svc create", "svc rm", "netpol apply", "netpol rm"):
        lines.append((f"{what} done", str(counts.get(what, 0)), "", "", "", ""))
    for what in ("ping", "connect"):
        lines.append((f"{what} answered", str(counts.get(what, 0)), "", "", "", ""))
    return lines


def verdict_lines(errors: dict, doctor: dict[str, list]) -> list[Line]:
    total = sum(errors.values())
    lines: list[Line] = [
        ("errors (none injected)", str(total), "", "", "0", "PASS" if not total else "MISS")
    ]
    lines += [(f"  {count} x {text}", "", "", "", "", "") for text, count in errors.items()]
    for name, findings in doctor.items():
        word = "clean" if not findings else f"{len(findings)} finding(s)"
        lines.append(
            (f"{name} pycni doctor", word, "", "", "clean", "MISS" if findings else "PASS")
        )
        lines += [(f"  {f}", "", "", "", "", "") for f in findings]
    return lines

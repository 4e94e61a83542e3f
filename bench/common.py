"""Shared pieces of the benchmarks: statistics, namespaces, a pycnid process, the configs.

Everything a benchmark makes carries this run's prefix (namespaces) or lives in its temp dir,
so `Sandbox.close()` removes all of it, also after a failure or SIGTERM. Nothing here touches
the machine's root network namespace: bridges, veths and masquerade rules are made only inside
the "node" namespaces, by the plugins.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE_BIN = "/usr/lib/cni"
CNI_VERSION = "1.0.0"  # the newest version the Debian reference plugins (1.1.x) speak


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (p99 of 50 samples is the largest but one)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(pct / 100.0 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def report_header(config: dict) -> dict:
    """The start of every benchmark's JSON report: when, on what machine, with what config."""
    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "loadavg_start": round(os.getloadavg()[0], 1),
        },
        "config": config,
    }


Line = tuple[str, str, str, str, str, str]  # label, pycni, reference, ratio, goal, result


def render_goal_table(
    name: str,
    report: dict,
    sections: list[tuple[str, list[Line]]],
    reference: str,
    widths: tuple[int, int] = (14, 14),
    column: str = "pycni",
) -> str:
    """A benchmark's summary: the machine line, then per section its lines of ``column``
    (pycni) against ``reference``, the ratio, the goal and PASS/MISS."""
    machine = report["machine"]
    width = max(len(line[0]) for _, lines in sections for line in lines) + 2
    ours, theirs = widths
    out = [
        f"pycni {name}  {report['when']}  {machine['cores']} cores  Python "
        f"{machine['python']}  kernel {machine['kernel']}  load average "
        f"{machine['loadavg_start']} -> {machine['loadavg_end']}",
        "",
        f"{'':{width}}{column:>{ours}}{reference:>{theirs}}{'ratio':>8}{'goal':>10}  result",
        "-" * (width + ours + theirs + 26),
    ]
    for title, lines in sections:
        out.append(f"[{title}]")
        out.extend(
            f"{a:{width}}{b:>{ours}}{c:>{theirs}}{d:>8}{e:>10}  {f}".rstrip()
            for a, b, c, d, e, f in lines
        )
    return "\n".join(out)


def finish_report(report: dict, started: float, directory: str, name: str) -> str:
    """Close a report (end load, seconds), write it as ``<name>-<stamp>.json`` and
    ``<name>-latest.json`` in ``directory``; the path of the first."""
    report["machine"]["loadavg_end"] = round(os.getloadavg()[0], 1)
    report["seconds"] = round(time.monotonic() - started, 1)
    os.makedirs(directory, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = os.path.join(directory, f"{name}-{stamp}.json")
    for target in (path, os.path.join(directory, f"{name}-latest.json")):
        with open(target, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1, sort_keys=True)
    return path


def run_sandboxed(
    name: str,
    args: Any,
    measure: Callable[[Any, Sandbox, str, dict], list],
    render: Callable[[dict, list], str],
) -> int:
    """A bench's main: root check, report header, ``measure(args, box, cni_bin, report)`` in
    a Sandbox with pycni's launchers written (it returns the table's sections), the report
    saved as ``name`` and printed. The exit status: the report's ``exit`` (0 if unset)."""
    if os.geteuid() != 0:
        sys.exit("bench: needs root (it makes network namespaces)")
    started = time.monotonic()
    report: dict = report_header(vars(args))
    with Sandbox() as box:
        report["sandbox"] = {"prefix": box.prefix, "workdir": box.workdir}
        sections = measure(args, box, write_launchers(os.path.join(box.workdir, "bin")), report)
    path = finish_report(report, started, args.results_dir, name)
    print(render(report, sections))
    print(f"results: {os.path.relpath(path, REPO)}  ({report['seconds']:.0f} s)")
    return int(report.get("exit", 0))


def median(values: list[float]) -> float:
    return percentile(values, 50)


def sh(cmd: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)


@dataclass
class Sandbox:
    """Owns the temp dir, namespaces and processes of one benchmark run."""

    prefix: str = field(default_factory=lambda: f"pycnib{os.getpid() % 100000}-")
    workdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="pycni-bench-"))
    namespaces: list[str] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)

    def __enter__(self) -> Sandbox:
        signal.signal(signal.SIGTERM, _raise_exit)
        signal.signal(signal.SIGHUP, _raise_exit)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def netns(self, name: str) -> str:
        full = f"{self.prefix}{name}"
        sh(["ip", "netns", "add", full])
        self.namespaces.append(full)
        sh(["ip", "-n", full, "link", "set", "lo", "up"])
        return full

    def pods(self, side: str, count: int) -> list[str]:
        """`count` fresh pod namespaces; returns their /var/run/netns paths."""
        return [f"/var/run/netns/{self.netns(f'{side}{i}')}" for i in range(count)]

    def drop_namespaces(self, paths_or_names: list[str]) -> None:
        for item in paths_or_names:
            name = os.path.basename(item)
            sh(["ip", "netns", "delete", name], check=False)
            if name in self.namespaces:
                self.namespaces.remove(name)

    def close(self) -> None:
        for proc in reversed(self.processes):
            stop_process(proc)
        for name in reversed(self.namespaces):
            for pid in sh(["ip", "netns", "pids", name], check=False).stdout.split():
                sh(["kill", "-9", pid], check=False)
            sh(["ip", "netns", "delete", name], check=False)
        self.namespaces.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _raise_exit(signum, _frame) -> None:
    raise SystemExit(128 + signum)


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def python_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": REPO}


def write_launchers(dest: str) -> str:
    sh([sys.executable, "-m", "cni.launcher", dest], cwd=REPO)
    return dest


def start_pycnid(
    box: Sandbox, node: str, tag: str = "", log_level: str = "info"
) -> tuple[subprocess.Popen, str]:
    """pycnid inside the node namespace with an embedded SQLite store; returns (proc, socket)."""
    state = os.path.join(box.workdir, f"pycnid{tag}")
    os.makedirs(state, exist_ok=True)
    sock = os.path.join(state, "pycnid.sock")
    config = {
        "socket": sock,
        "nodeName": "bench-node",
        "stateDir": state,
        "logLevel": log_level,
        "store": {"type": "sqlite", "path": os.path.join(state, "store.db")},
    }
    path = os.path.join(state, "pycnid.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(config, fh)
    log = open(os.path.join(state, "pycnid.log"), "ab")
    proc = subprocess.Popen(
        ["ip", "netns", "exec", node, sys.executable, "-m", "pycnid.main", "--config", path],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=python_env(),
        cwd=REPO,
    )
    log.close()
    box.processes.append(proc)
    wait_for_socket(proc, sock, os.path.join(state, "pycnid.log"))
    return proc, sock


def wait_for_socket(
    proc: subprocess.Popen, path: str, log_path: str, timeout: float = 20.0
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"pycnid exited {proc.returncode}: {tail(log_path)}")
        try:
            with socket.socket(socket.AF_UNIX) as probe:
                probe.connect(path)
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"pycnid did not come up in {timeout:g}s: {tail(log_path)}")


def tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
    except OSError:
        return ""


def vm_rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def bridge_config(name: str, plugin: str, ipam: dict, masq: bool, **extra) -> dict:
    """The same network shape for both sides (example-conflist features)."""
    return {
        "cniVersion": CNI_VERSION,
        "name": name,
        "type": plugin,
        "bridge": "cnibench0",
        "isGateway": True,
        "ipMasq": masq,
        "ipam": ipam,
        **extra,
    }


def pycni_config(masq: bool) -> dict:
    """No `daemonSocket` key: as on a real node, the plugin finds pycnid at the default path
    (here $PYCNI_SOCKET), without parsing the netconf itself."""
    ipam = {
        "type": "pycni-ipam",
        "ranges": [[{"subnet": "10.66.0.0/16"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
    }
    return bridge_config("bench-pycni", "pycni-bridge", ipam, masq)


def reference_config(data_dir: str, masq: bool) -> dict:
    ipam = {
        "type": "host-local",
        "ranges": [[{"subnet": "10.67.0.0/16"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": data_dir,
    }
    return bridge_config("bench-ref", "bridge", ipam, masq)


def reference_version() -> str:
    out = sh(["dpkg-query", "-W", "-f=${Version}", "containernetworking-plugins"], check=False)
    return out.stdout.strip() or "unknown"

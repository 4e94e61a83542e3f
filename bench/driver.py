"""Runs one side's ADDs and DELs from inside its node namespace and times each exec.

    ip netns exec NODE python3 -m bench.driver SPEC.json   -> JSON timings on stdout

SPEC: {"binary", "config", "env", "pods": [netns paths], "concurrency", "ifname", "daemon_pid"}.
The plugin is
exec'd exactly as a runtime does (CNI_* env, netconf on stdin; DEL carries the ADD result as
prevResult, as libcni does). Timings are wall-clock seconds around each exec; the churn wall
time covers all ADDs (resp. DELs) at the given concurrency. CPU seconds per phase (the plugin
processes with their children, and pycnid's own) are a figure that the machine's other load
barely distorts.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def brief(text: str) -> str:
    return " ".join(text.split())[:300]


def invoke(spec: dict, command: str, netns: str, stdin: bytes) -> tuple[float, int, str]:
    env = {
        **spec["env"],
        "CNI_COMMAND": command,
        "CNI_NETNS": netns,
        "CNI_CONTAINERID": "bench-" + os.path.basename(netns),
        "CNI_IFNAME": spec.get("ifname", "eth0"),
        "CNI_ARGS": "",
    }
    start = time.perf_counter()
    proc = subprocess.run([spec["binary"]], input=stdin, env=env, capture_output=True)
    elapsed = time.perf_counter() - start
    return elapsed, proc.returncode, proc.stdout.decode(errors="replace")


def add_one(spec: dict, netns: str) -> tuple[float, dict | None, str]:
    elapsed, code, out = invoke(spec, "ADD", netns, json.dumps(spec["config"]).encode())
    if code != 0:
        return elapsed, None, brief(out) or f"exit {code}"
    return elapsed, json.loads(out), ""


def del_one(spec: dict, netns: str, prev: dict | None) -> tuple[float, str]:
    config = dict(spec["config"])
    if prev is not None:
        config["prevResult"] = prev
    elapsed, code, out = invoke(spec, "DEL", netns, json.dumps(config).encode())
    return elapsed, ("" if code == 0 else brief(out) or f"exit {code}")


def cpu_of_children() -> float:
    """CPU seconds of every reaped child (and what they reaped: host-local, iptables …)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_of_process(pid: int | None) -> float:
    """CPU seconds pycnid has used so far (utime + stime from /proc/PID/stat)."""
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: CPU seconds a second under which a pycnid counts as settled (``wait_idle``)
IDLE = 0.1
IDLE_WINDOW = 0.5  # seconds


def wait_idle(proc: subprocess.Popen | None, timeout: float) -> float | None:
    """Seconds until ``proc`` used less than ``IDLE`` of a CPU over ``IDLE_WINDOW`` (a pycnid
    done taking in what it was just given); None after ``timeout``."""
    started, pid = time.monotonic(), proc.pid if proc is not None else None
    while time.monotonic() - started < timeout:
        before = cpu_of_process(pid)
        time.sleep(IDLE_WINDOW)
        if cpu_of_process(pid) - before < IDLE * IDLE_WINDOW:
            return time.monotonic() - started
    return None


def cpu_mark(spec: dict) -> tuple[float, float]:
    return cpu_of_children(), cpu_of_process(spec.get("daemon_pid"))


def run(spec: dict) -> dict:
    pods = spec["pods"]
    workers = int(spec.get("concurrency", 1))
    errors: list[str] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        cpu0 = cpu_mark(spec)
        start = time.perf_counter()
        adds = list(pool.map(lambda ns: add_one(spec, ns), pods))
        add_wall = time.perf_counter() - start
        cpu1 = cpu_mark(spec)
        start = time.perf_counter()
        dels = list(
            pool.map(lambda item: del_one(spec, item[0], item[1][1]), zip(pods, adds, strict=True))
        )
        del_wall = time.perf_counter() - start
        cpu2 = cpu_mark(spec)
    errors += [f"ADD: {err}" for _, _, err in adds if err]
    errors += [f"DEL: {err}" for _, err in dels if err]
    ips = [ip["address"] for _, res, _ in adds if res for ip in res.get("ips", [])]
    return {
        "add": [t for t, res, _ in adds if res is not None],
        "del": [t for t, err in dels if not err],
        "add_wall": add_wall,
        "del_wall": del_wall,
        "pods": len(pods),
        "add_cpu": cpu1[0] - cpu0[0],
        "add_daemon_cpu": cpu1[1] - cpu0[1],
        "del_cpu": cpu2[0] - cpu1[0],
        "del_daemon_cpu": cpu2[1] - cpu1[1],
        "unique_ips": len(set(ips)),
        "ips": len(ips),
        "errors": errors[:5],
        "error_count": len(errors),
    }


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as fh:
        spec = json.load(fh)
    json.dump(run(spec), sys.stdout)


if __name__ == "__main__":
    main()

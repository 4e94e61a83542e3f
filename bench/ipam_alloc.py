"""`make bench-ipam`: IPAM allocations per second and p50/p99 ADD latency on a real etcd, one
node and three nodes at once.

    python3 -m bench.ipam_alloc [--count 1000] [--concurrency 1,4] [--modes lease,socket,exe]
                                [--exe-count 150] [--profile DIR]

Topology (tests/fixtures/cluster.py): one etcd member in a control-plane namespace and three
node namespaces on an underlay bridge, each running its own pycnid (etcd store, INFO logs off).
Each node is driven by its own client process (bench/ipam_worker.py), with ``concurrency``
calls in flight per node (each value of the list is a row; at R ADDs/s with C calls in flight
the mean latency is C/R, so the goal's p99 needs few calls in flight per node):
  lease   LeaseService in-process (the allocator + one etcd txn per ADD), inside the node netns
  socket  through pycnid's unix socket with the executable's own code, no process spawn
  exe     the real pycni-ipam executable (process spawn included), for reference
Every round gets a pool of its own; the last row, socket+churn, restarts node1's pycnid and
repeats its socket round on the pool the first one left behind (all its addresses released and
in their reuse delay): a node restarted after pod churn.
Goal (many Pods started at once on many nodes must not queue on the store): >= 1,000 allocations/s
in aggregate with p99 <= 10 ms. Prints a table with PASS/MISS and writes JSON to
bench/results/ipam-<time>.json (and ipam-latest.json). With ``--profile DIR`` a py-spy (if
installed) flame of each pycnid and a cProfile of one lease worker are written to DIR. Nothing here
touches the root network namespace.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from tests.fixtures.cluster import Cluster, ClusterNode

from .common import REPO, percentile, write_launchers

RESULTS_DIR = os.path.join(REPO, "bench", "results")
GOAL_RATE = 1000.0
GOAL_P99_MS = 10.0


def netconf(index: int) -> dict:
    """Round ``index``'s network: a pool of its own, so every round starts from the same state."""
    return {
        "cniVersion": "1.1.0",
        "name": f"bench-{index}",
        "type": "ptp",
        "ipam": {
            "type": "pycni-ipam",
            "ranges": [[{"subnet": f"10.{200 + index}.0.0/16", "blockSize": 26}]],
        },
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.ipam_alloc", description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="ADDs per node (lease, socket)")
    parser.add_argument("--exe-count", type=int, default=150, help="ADDs per node (exe)")
    parser.add_argument(
        "--concurrency", default="1,4", help="calls in flight per node; a comma list runs each"
    )
    parser.add_argument("--modes", default="lease,socket,exe")
    parser.add_argument("--profile", default=None, help="write profiles to this directory")
    return parser.parse_args(argv)


def start_worker(
    node: ClusterNode, mode: str, spec: dict, profile: str | None
) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "bench.ipam_worker",
        json.dumps({**spec, "mode": mode, "node": node.name}),
    ]
    if profile and mode == "lease" and node.name == "node1":
        cmd[1:1] = ["-m", "cProfile", "-o", os.path.join(profile, f"lease-{node.name}.prof")]
    if mode == "lease":  # reaches etcd on the underlay like pycnid does
        cmd = ["ip", "netns", "exec", node.host.ns.name, *cmd]
    elif mode in ("socket", "exe"):
        spec_env = {"socket": node.socket, "netns": node.pod.path}
        cmd[-1] = json.dumps({**json.loads(cmd[-1]), **spec_env})
    return subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": REPO},
        cwd=REPO,
    )


def expect(proc: subprocess.Popen, word: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != word:
        proc.kill()
        raise RuntimeError(f"worker said {line!r} instead of {word!r}")


def go(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


def run_round(
    cluster: Cluster, nodes: list[ClusterNode], mode: str, spec: dict, profile: str | None
) -> dict:
    """All nodes' workers warm up, ADD at once, then DEL at once; aggregate their figures,
    with the CPU seconds each party spent in the ADD phase (load-independent)."""
    procs = [start_worker(node, mode, spec, profile) for node in nodes]
    spies = []
    daemons = [n.daemon.proc.pid for n in cluster.nodes if n.daemon.proc]
    etcd = [m.proc.pid for m in cluster.etcd.members if m.proc]
    try:
        for proc in procs:
            expect(proc, "ready")
        if profile and mode == "socket":
            spies = [
                py_spy(
                    node, profile, f"{spec.get('tag', mode)}-{len(nodes)}n-{spec['concurrency']}"
                )
                for node in nodes
            ]
        cpu = (proc_cpu(daemons), proc_cpu(etcd))
        go(procs)
        for proc in procs:
            expect(proc, "added")
        cpu = (proc_cpu(daemons) - cpu[0], proc_cpu(etcd) - cpu[1])
        go(procs)
        results = [json.loads(proc.stdout.readline()) for proc in procs]  # type: ignore[union-attr]
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    finally:
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for spy in spies:
            spy.wait(timeout=60)
    figures = {phase: aggregate([r[phase] for r in results]) for phase in ("add", "del")}
    adds = figures["add"]["n"] or 1
    client = sum(r["add"]["client_cpu"] for r in results)
    figures["cpu_ms_per_add"] = {
        "client": 1000 * client / adds,
        "pycnid": 1000 * cpu[0] / adds,
        "etcd": 1000 * cpu[1] / adds,
    }
    return figures


def proc_cpu(pids: list[int]) -> float:
    """utime + stime of the processes, in seconds (from /proc/<pid>/stat)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def aggregate(parts: list[dict]) -> dict:
    samples = [ms for part in parts for ms in part["ms"]]
    start = min(p["started"] for p in parts)
    end = max(p["started"] + p["wall"] for p in parts)
    errors = sum(p["error_count"] for p in parts)
    return {
        "n": len(samples),
        "rate": (len(samples) - errors) / (end - start),
        "p50_ms": percentile(samples, 50),
        "p99_ms": percentile(samples, 99),
        "max_ms": max(samples),
        "errors": errors,
        "first_errors": [e for p in parts for e in p["errors"]][:5],
    }


def py_spy(node: ClusterNode, profile: str, tag: str) -> subprocess.Popen:
    """Sample pycnid for a few seconds (py-spy record, SVG flame + raw for text)."""
    spy = shutil.which("py-spy")
    if spy is None or node.daemon.proc is None:
        return subprocess.Popen(["true"])
    out = os.path.join(profile, f"pycnid-{node.name}-{tag}.txt")
    return subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(node.daemon.proc.pid),
            "--duration",
            "3",
            "--rate",
            "250",
            "--gil",
            "--format",
            "raw",
            "--output",
            out,
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def verdict(add: dict) -> str:
    ok = add["errors"] == 0 and add["rate"] >= GOAL_RATE and add["p99_ms"] <= GOAL_P99_MS
    return "PASS" if ok else "MISS"


def render(rows: list[tuple[str, str, dict]]) -> str:
    head = (
        f"{'path':<12} {'nodes':>5} {'inflt':>5} {'ADD/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'max ms':>8} {'DEL/s':>8} {'errors':>6} {'CPU ms/ADD cli+d+etcd':>22}  "
        f"goal >= {GOAL_RATE:.0f}/s, p99 <= {GOAL_P99_MS:g} ms"
    )
    lines = [head, "-" * len(head)]
    for mode, nodes, fig in rows:
        add, dele = fig["add"], fig["del"]
        lines.append(
            f"{mode:<12} {nodes:>5} {fig['concurrency']:>5} {add['rate']:>8.0f} "
            f"{add['p50_ms']:>8.2f} {add['p99_ms']:>8.2f} {add['max_ms']:>8.1f} "
            f"{dele['rate']:>8.0f} {add['errors'] + dele['errors']:>6} "
            f"{render_cpu(fig['cpu_ms_per_add']):>22}  {verdict(add)}"
        )
    return "\n".join(lines)


def render_cpu(cpu: dict) -> str:
    return f"{cpu['client']:.2f}+{cpu['pycnid']:.2f}+{cpu['etcd']:.2f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    cni_bin = write_launchers(tempfile.mkdtemp(prefix="pycni-bench-bin-"))
    started = time.time()
    load_before = os.getloadavg()[0]
    if load_before > (os.cpu_count() or 1):
        print(
            f"warning: load average {load_before:.1f} on {os.cpu_count()} cores before the "
            "run; other work on this machine skews every figure",
            flush=True,
        )
    cluster = Cluster.create(1)
    rows: list[tuple[str, str, dict]] = []
    try:
        cluster.etcd.start()
        for _ in range(3):
            cluster.add_node(logLevel="warning", faultInjection=False)
        spec = {"endpoints": cluster.etcd.endpoints, "cni_bin": cni_bin}
        rounds = [
            (mode, nodes, concurrency)
            for mode in modes
            for concurrency in [int(c) for c in str(args.concurrency).split(",") if c]
            for nodes in (1, 3)
        ]
        if "socket" in modes:  # again on the first socket round's pool, every address cooling
            rounds.append(("socket+churn", 1, 1))
        for index, (mode, nodes, concurrency) in enumerate(rounds):
            base = mode.split("+")[0]
            pool = (
                index
                if mode == base
                else next(i for i, r in enumerate(rounds) if r[0] == base and r[1] == 1)
            )
            count = args.exe_count if mode == "exe" else args.count
            if mode != base:  # the restart drops what pycnid learnt in memory
                cluster.nodes[0].daemon.stop()
                cluster.nodes[0].daemon.start()
            figures = run_round(
                cluster,
                cluster.nodes[:nodes],
                base,
                {
                    **spec,
                    "netconf": netconf(pool),
                    "count": count,
                    "concurrency": concurrency,
                    "tag": mode.replace("+", ""),
                },
                args.profile,
            )
            rows.append((mode, str(nodes), {**figures, "concurrency": concurrency}))
            print(render(rows[-1:]).splitlines()[-1], flush=True)
    finally:
        cluster.close()
        shutil.rmtree(cni_bin, ignore_errors=True)
    print()
    print(render(rows))
    write_results(args, rows, time.time() - started, load_before)
    return 0


def write_results(
    args: argparse.Namespace, rows: list, seconds: float, load_before: float
) -> None:
    os.makedirs(RESULTS_DIR, exist_ok=True)
    data = {
        "goal": {"rate": GOAL_RATE, "p99_ms": GOAL_P99_MS},
        "config": {
            "count": args.count,
            "exe_count": args.exe_count,
            "concurrency": args.concurrency,
        },
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "loadavg_before": round(load_before, 2),
            "loadavg_after": round(os.getloadavg()[0], 2),
        },
        "seconds": round(seconds, 1),
        "rows": [
            {"path": mode, "nodes": int(nodes), "verdict": verdict(fig["add"]), **fig}
            for mode, nodes, fig in rows
        ],
    }
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for name in (f"ipam-{stamp}.json", "ipam-latest.json"):
        with open(os.path.join(RESULTS_DIR, name), "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1)
    print(f"results: bench/results/ipam-{stamp}.json")


if __name__ == "__main__":
    sys.exit(main())

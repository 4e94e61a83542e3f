"""`make soak`: the whole product under continuous churn on three nodes (a bench, not a test).

    python3 -m bench.soak [--minutes 10] [--nodes 3] [--in-flight 2] [--hold 1 4]
                          [--change-every 5] [--traffic-every 1] [--sample-every 5]
                          [--results-dir DIR]

A vxlan cluster (bench/overlay_topo.py: a real etcd, a pycnid a node namespace with the
overlay, the Service proxy and NetworkPolicy enforcement). One stable Pod a node runs a TCP
server behind Service ``stable/web``. Then for ``--minutes`` (bench/soak_churn.py): on every
node ``--in-flight`` Pods at a time are ADDed through pycni-bridge + pycni-ipam, given an
endpoint record with labels, kept ``--hold`` seconds and DELeted; every ``--change-every``
seconds a Service is created and a NetworkPolicy applied by `pycni svc`/`pycni netpol` (the
oldest past three removed); every ``--traffic-every`` seconds a stable Pod pings a Pod on
another node and connects to the Service's ClusterIP. Reported (bench/soak_report.py): each
pycnid's VmRSS and open fds (start, end, least-squares slope per hour), ADD p99 a minute,
ADD/DEL counts, every distinct error (nothing is injected: any is one), and `pycni doctor` on
every node once the churned Pods are gone. Exit 1 on any error or a doctor finding.

Results: bench/results/soak-<time>.json and soak-latest.json. Only namespaces this run makes
are touched; they, the processes, the temp dirs and etcd's data go on exit, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from tests.fixtures.echo import WHOAMI_SERVER
from tests.fixtures.netns import PREFIX, cleanup_all
from tests.fixtures.waiting import wait_for
from tests.overlay.pods import NETWORK, pycni_cli, python_in

from . import soak_churn as churn
from . import soak_report as figures
from .common import REPO, Line, Sandbox, python_env, render_goal_table, run_sandboxed
from .overlay_topo import start_cluster

RESULTS_DIR = os.path.join(REPO, "bench", "results")
POD_CIDR = "10.136.0.0/16"
DAEMON = {"services": {"proxy": True}, "networkPolicy": {"enforce": True}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the churn runs")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=2, help="Pods churning a node at once")
    parser.add_argument("--hold", type=float, nargs=2, default=(1.0, 4.0), metavar=("MIN", "MAX"))
    parser.add_argument("--change-every", type=float, default=5.0, help="Service/policy change")
    parser.add_argument("--traffic-every", type=float, default=1.0, help="ping and connect")
    parser.add_argument("--sample-every", type=float, default=5.0, help="VmRSS and fds")
    parser.add_argument("--results-dir", default=RESULTS_DIR)
    return parser.parse_args(argv)


# --- setup ---------------------------------------------------------------------------------
def setup_stable(soak: churn.Soak, box: Sandbox) -> None:
    """A stable Pod with a TCP server on every node, Service ``stable/web`` in front of them,
    answering through its ClusterIP before the churn starts."""
    node1 = soak.built.nodes[0]
    run_cli(node1, "svc", "config", "set", "--cidr", churn.SVC_CIDR)
    for node in soak.built.nodes:
        pod = churn.add_pod(soak, node, {"app": "web"}, churn.STABLE_NS)
        if pod is None:
            raise RuntimeError(f"stable Pod on {node.name}: {dict(soak.tally.errors)}")
        soak.stable.append(pod)
        box.processes.append(subprocess.Popen(python_in(pod.ns, WHOAMI_SERVER)))
    web = ["stable/web", "--cluster-ip", churn.STABLE_VIP, "--port", "80/TCP:8080"]
    run_cli(node1, "svc", "create", *web, "--selector", "app=web")
    connect = python_in(soak.stable[0].ns, churn.CONNECT.format(ip=churn.STABLE_VIP))
    wait_for(
        "the stable Service to answer",
        lambda: subprocess.run(connect, capture_output=True, timeout=10).returncode == 0,
        timeout=30,
        step=0.5,
    )


def run_cli(node, *args: str) -> None:
    out = pycni_cli(node, *args)
    if out.returncode != 0:
        raise RuntimeError(f"pycni {' '.join(args)}: {out.stdout}{out.stderr}")


def start_workers(soak: churn.Soak, args: argparse.Namespace) -> list[threading.Thread]:
    hold, serials = tuple(args.hold), itertools.count()
    loops: list[tuple[str, Callable[[], float], Callable[[], None]]] = [
        ("churn", lambda: 0.0, functools.partial(churn.churn_once, soak, node, hold))
        for node in soak.built.nodes
        for _ in range(args.in_flight)
    ]
    loops += [
        ("change", lambda: args.change_every, lambda: churn.change_once(soak, next(serials))),
        ("ping", lambda: args.traffic_every, lambda: churn.ping_once(soak)),
        ("connect", lambda: args.traffic_every, lambda: churn.connect_once(soak)),
    ]
    threads = [
        threading.Thread(target=soak.loop, args=loop, name=loop[0], daemon=True) for loop in loops
    ]
    for thread in threads:
        thread.start()
    return threads


# --- the end -------------------------------------------------------------------------------
def doctor(node) -> list[str]:
    """`pycni doctor` in the node's namespace with its pycnid's config: its findings."""
    config = os.path.join(node.daemon.workdir, "pycnid.json")
    argv = [sys.executable, "-m", "cli", "doctor", "--config", config, "--network", NETWORK]
    cmd = ["ip", "netns", "exec", node.host.ns.name, *argv, "--output", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=python_env())
    if out.returncode not in (0, 2):
        return [f"doctor exited {out.returncode}: {out.stderr.strip()[-300:]}"]
    found = json.loads(out.stdout)["findings"]
    return [f"{f['kind']} {f['object']}: {f['why']}" for f in found]


def doctor_all(soak: churn.Soak) -> dict[str, list[str]]:
    """Every node's findings; a node with some is asked again 5 s later (the proxy follows a
    removed endpoint record at its watch, not at once): what stays is reported."""
    time.sleep(2.0)
    found = {node.name: doctor(node) for node in soak.built.nodes}
    if any(found.values()):
        time.sleep(5.0)
        found = {node.name: doctor(node) for node in soak.built.nodes}
    return found


def stop_workers(soak: churn.Soak, threads: list[threading.Thread]) -> None:
    """Stop the loops and wait for each to finish its step (a churned Pod is DELeted)."""
    soak.stop.set()
    deadline = time.monotonic() + 60
    for thread in threads:
        thread.join(max(0.1, deadline - time.monotonic()))


def close(soak: churn.Soak, box: Sandbox, report: dict) -> None:
    cluster = soak.built.cluster
    report["namespace_prefix"] = PREFIX
    report["dirs"] = [cluster.workdir, cluster.etcd.workdir]
    report["pids"] = [m.proc.pid for m in cluster.etcd.members if m.proc]
    report["pids"] += [n.daemon.proc.pid for n in cluster.nodes if n.daemon.proc]
    for proc in box.processes:
        proc.kill()
    cluster.close()
    cleanup_all()  # a Pod namespace a worker made as the cluster went


def soak_for(
    soak: churn.Soak, args: argparse.Namespace, report: dict, threads: list[threading.Thread]
) -> None:
    """The churn for ``--minutes`` (its threads put in ``threads``), then the figures."""
    sampler = figures.Sampler(soak.built.nodes, args.sample_every)
    soak.tally = churn.Tally(started=sampler.started)  # the stable Pods' ADDs are not counted
    threads += start_workers(soak, args)
    threads.append(threading.Thread(target=sampler.run, args=(soak.stop,), daemon=True))
    threads[-1].start()
    print(f"--> churning for {args.minutes:g} min", file=sys.stderr, flush=True)
    deadline = time.monotonic() + args.minutes * 60
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    stop_workers(soak, threads)
    sampler.sample()
    report["daemons"] = sampler.summary()
    report.update(figures.tally_summary(soak.tally))
    report["doctor"] = doctor_all(soak)


def run(args: argparse.Namespace, box: Sandbox, cni_bin: str, report: dict) -> list:
    built = start_cluster("vxlan", args.nodes, cni_bin, cidr=POD_CIDR, daemon=DAEMON)
    soak = churn.Soak(built, churn.Tally(), box.workdir)
    threads: list[threading.Thread] = []
    try:
        setup_stable(soak, box)
        soak_for(soak, args, report, threads)
    finally:
        stop_workers(soak, threads)
        close(soak, box, report)
    clean = not report["errors"] and not any(report["doctor"].values())
    report["exit"] = 0 if clean else 1
    return sections(report)


def sections(report: dict) -> list[tuple[str, list[Line]]]:
    daemons = [
        line for name, f in report["daemons"].items() for line in figures.daemon_lines(name, f)
    ]
    return [
        ("pycnid over the run (slope: least squares)", daemons),
        ("churn", figures.add_lines(report["counts"], report["add_per_minute"])),
        ("verdict", figures.verdict_lines(report["errors"], report["doctor"])),
    ]


def render(report: dict, sections: list[tuple[str, list[Line]]]) -> str:
    return render_goal_table("soak", report, sections, "end", (14, 14), column="start")


def main(argv: list[str] | None = None) -> int:
    """Ctrl-C ends the run as SIGTERM does (everything removed on the way out), without a
    traceback: 130."""
    try:
        return run_sandboxed("soak", parse_args(argv), run, render)
    except KeyboardInterrupt:
        print("bench.soak: interrupted, everything it made removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""`make bench-svc-e2e`: the Service proxy end to end in pycnid, on two real nodes.

    python3 -m bench.svc_e2e [--reps 5] [--services 10000] [--endpoints 5] [--updates 5]
                             [--timeout 900] [--results-dir DIR]

A 2-node vxlan cluster (bench/overlay_topo.py: etcd and pycnids with ``services.proxy``), a
backend Pod with a TCP server on node1, a client Pod on node2, the backend's endpoint record
written directly (as pycni-svc would). Measured:

- create -> connect, ``--reps`` times: from starting `pycni svc create` (a subprocess on node1,
  as an operator runs it) until the client Pod's first successful TCP connect to the new VIP.
  One long-lived poller in the client Pod starts a non-blocking connect every 5 ms; the figure
  minus the CLI's own run time is what the watch + proxy pass + nft commit took after it
  exited (negative: the VIP answered before the CLI's process had finished exiting);
- at scale: ``--services`` Services x ``--endpoints`` endpoints written into etcd in bulk (the
  store's ``txn``, 126 puts a txn, from a writer inside node1: bench/svc_e2e_load.py), then on
  node2: VmRSS of pycnid before and after it programmed them
  (``pycni_proxy_services{family="ipv4"}``), a restarted pycnid (its first pass from
  ``pycni_proxy_sync_seconds``, its logged transactions, VmRSS sampled and split:
  bench/svc_e2e_cold.py), and ``--updates`` times each one endpoint changed and one Service
  created, from the put until the kernel of node2 holds it (a kept libnftables context polling
  every 2 ms: bench/svc_e2e_kernel.py; metrics polling cost ~200 ms a scrape).

Results: bench/results/svc-e2e-<time>.json and svc-e2e-latest.json, and a table. Only
namespaces this run creates are touched. Figures, never timed assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from services.record import EndpointRecord
from tests.fixtures.echo import WHOAMI_SERVER
from tests.overlay.pods import pycni_cli, python_in

from . import svc_e2e_cold as cold
from . import svc_e2e_kernel as kernel
from .common import (
    REPO,
    Line,
    Sandbox,
    median,
    percentile,
    render_goal_table,
    run_sandboxed,
    vm_rss_kib,
)
from .overlay_topo import start_cluster
from .svc_e2e_load import METRICS, POLLER, services_metric, wait_metric

RESULTS_DIR = os.path.join(REPO, "bench", "results")
CIDR = "10.96.0.0/16"  # bulk VIPs from 10.96.0.1 up; the create runs use 10.96.255.x


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.svc_e2e", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="create -> connect repetitions")
    add_scale_options(parser, 5, "endpoint updates and Service creates at scale, each")
    return parser.parse_args(argv)


def add_scale_options(parser: argparse.ArgumentParser, updates: int, what: str) -> None:
    """The options of a bench at scale: its size, how many changes (``what``), the timeout
    of each step and where the results go."""
    parser.add_argument("--services", type=int, default=10000, help="Services in bulk")
    parser.add_argument("--endpoints", type=int, default=5, help="endpoints a bulk Service")
    parser.add_argument("--updates", type=int, default=updates, help=what)
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds to wait for the proxy at each step"
    )
    parser.add_argument("--results-dir", default=RESULTS_DIR)


# --- create -> first connect ---------------------------------------------------------------
def setup_pods(box: Sandbox, built) -> tuple:
    """The backend (TCP server, endpoint record app=e2e) on node1, the client on node2, and
    the client's poller (stdin: "VIP PORT", stdout: "ok <monotonic stamp>")."""
    n1, n2 = built.nodes
    backend, client = built.add_pod(n1), built.add_pod(n2)
    box.processes.append(subprocess.Popen(python_in(backend.ns, WHOAMI_SERVER)))
    ep = EndpointRecord("bench", "backend", "eth0", (backend.ip,), {"app": "e2e"}, n1.name)
    built.cluster.etcd.put(ep.key, ep.to_bytes())
    poller = subprocess.Popen(
        python_in(client.ns, POLLER), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    box.processes.append(poller)
    return backend, client, poller


def measure_create(built, poller: subprocess.Popen, rep: int) -> dict:
    """One `pycni svc create` of a new VIP, the poller already knocking on it."""
    vip = f"10.96.255.{10 + rep}"
    poller.stdin.write(f"{vip} 80\n")
    poller.stdin.flush()
    started = time.monotonic()
    out = pycni_cli(
        built.nodes[0],
        "svc",
        "create",
        f"bench/e2e{rep}",
        "--cluster-ip",
        vip,
        "--port",
        "80/TCP:8080",
        "--selector",
        "app=e2e",
        "--output",
        "json",
    )
    cli_done = time.monotonic()
    if out.returncode != 0:
        raise RuntimeError(f"pycni svc create: {out.stderr}")
    word, stamp = poller.stdout.readline().split()
    assert word == "ok", word
    connected = float(stamp)
    return {
        "vip": vip,
        "create_to_connect": connected - started,
        "cli": cli_done - started,
        "after_cli": connected - cli_done,
    }


def summarize(runs: list[dict]) -> dict:
    def stats(key: str) -> dict:
        values = [r[key] for r in runs]
        return {"p50": median(values), "max": percentile(values, 100)}

    return {"runs": runs, **{k: stats(k) for k in ("create_to_connect", "cli", "after_cli")}}


# --- at scale ------------------------------------------------------------------------------
def write_bulk_from(node, endpoints: list[str], services: int, per_service: int) -> list:
    cmd = [
        "ip",
        "netns",
        "exec",
        node.host.ns.name,
        sys.executable,
        "-m",
        "bench.svc_e2e_load",
        "--write",
        ",".join(endpoints),
        str(services),
        str(per_service),
    ]
    out = subprocess.run(
        cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}
    )
    if out.returncode != 0:
        raise RuntimeError(f"bulk writer: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def measure_scale(
    built, services: int, per_service: int, present: int, updates: int, timeout: float
) -> dict:
    """Bulk write, programmed (RSS before/after), a cold first pass, one endpoint update."""
    n1, n2 = built.nodes
    ns, want = n2.host.ns.name, services + present
    rss_before = vm_rss_kib(n2.daemon.proc.pid)
    first, last = write_bulk_from(n1, built.cluster.etcd.endpoints, services, per_service)
    lag = time.time() - time.monotonic()  # wall clock -> monotonic, for the writer's stamps
    done, _ = wait_metric(ns, lambda s: services_metric(s) >= want, timeout)
    out = {
        "services": services,
        "endpoints_each": per_service,
        "write_seconds": last - first,
        "write_to_programmed": None if done is None else done + lag - first,
        "rss_kib_before": rss_before,
        "rss_kib_programmed": vm_rss_kib(n2.daemon.proc.pid),
    }
    out["cold"] = measure_cold(n2, want, timeout)
    out.update(measure_kernel(built, services, per_service, updates, timeout))
    return out


def measure_cold(node, want: int, timeout: float) -> dict:
    """pycnid restarted (logLevel info) with every Service in the store: exec -> all
    programmed, its passes (histogram and log lines), VmRSS sampled, peak and split."""
    node.daemon.stop()
    node.daemon.config["logLevel"] = "info"
    offset = len(node.daemon.log())
    started = time.monotonic()
    node.daemon.start(timeout=60)
    sampler = cold.RssSampler(node.daemon.proc.pid)
    done, samples = wait_metric(
        node.host.ns.name,
        lambda s: services_metric(s) >= want and s.get("pycni_proxy_sync_seconds_count", 0) >= 1,
        timeout,
    )
    count = samples.get("pycni_proxy_sync_seconds_count", 0)
    total = samples.get("pycni_proxy_sync_seconds_sum", 0.0)
    programmed = cold.calc_memory(node.daemon.proc.pid)
    time.sleep(2.0)
    return {
        "exec_to_programmed": None if done is None else done - started,
        "passes": count,
        "first_pass": total if count == 1 else None,
        "passes_mean": total / count if count else None,
        "rss_kib": programmed["VmRSS"],
        "memory_programmed": programmed,
        "memory_2s_later": cold.calc_memory(node.daemon.proc.pid),
        "rss_peak": cold.calc_peak(sampler.close()),
        "logged": cold.parse_passes(node.daemon.log()[offset:]),
    }


def measure_kernel(built, services: int, per_service: int, count: int, timeout: float) -> dict:
    """One endpoint changed, and one Service created, ``count`` times each at scale: put ->
    element in node2's kernel (bench/svc_e2e_kernel.py)."""
    poller, checker = kernel.start_poller(built.nodes[1]), kernel.start_poller(built.nodes[1])
    try:
        return {
            "update": kernel.measure_updates(
                built.cluster, poller, services, per_service, count, timeout
            ),
            "create": kernel.measure_creates(built.cluster, poller, checker, count, timeout),
        }
    finally:
        for p in (poller, checker):
            p.stdin.close()
            p.wait(10)


# --- report --------------------------------------------------------------------------------
def ms(value: float | None) -> str:
    return "timeout" if value is None else f"{value * 1000:.0f} ms"


def secs(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def mib(kib: int | None) -> str:
    return "—" if not kib else f"{kib / 1024:.1f} MiB"


def create_lines(cr: dict) -> list[Line]:
    n = len(cr["runs"])
    return [
        (
            f"svc create -> first connect, p50 of {n}",
            ms(cr["create_to_connect"]["p50"]),
            "",
            "",
            "",
            "",
        ),
        ("  max", ms(cr["create_to_connect"]["max"]), "", "", "", ""),
        ("  minus the CLI's run time, p50", ms(cr["after_cli"]["p50"]), "", "", "", ""),
        ("  minus the CLI's run time, max", ms(cr["after_cli"]["max"]), "", "", "", ""),
        ("  the CLI's own run time, p50", ms(cr["cli"]["p50"]), "", "", "", ""),
    ]


def scale_lines(sc: dict) -> list[Line]:
    cold = sc["cold"]
    ratio = (
        f"{sc['rss_kib_programmed'] / sc['rss_kib_before']:.2f}x"
        if sc["rss_kib_programmed"] and sc["rss_kib_before"]
        else ""
    )
    first = (
        ("  its first pass", cold["first_pass"])
        if cold["first_pass"] is not None
        else (f"  mean of its {cold['passes']:.0f} passes", cold["passes_mean"])
    )
    return [
        ("bulk write through the store's txn", secs(sc["write_seconds"]), "", "", "", ""),
        ("first txn -> all programmed on node2", secs(sc["write_to_programmed"]), "", "", "", ""),
        (
            "pycnid VmRSS programmed (vs before)",
            mib(sc["rss_kib_programmed"]),
            mib(sc["rss_kib_before"]),
            ratio,
            f"<={GOALS['rss_mib']} MiB",
            verdict(sc["rss_kib_programmed"], GOALS["rss_mib"] * 1024),
        ),
        ("restarted pycnid: exec -> programmed", secs(cold["exec_to_programmed"]), "", "", "", ""),
        (first[0], secs(first[1]), "", "", "", ""),
        ("  transactions it logged", str(len(cold["logged"])), "", "", "", ""),
        (
            "  its VmRSS then (peak sampled)",
            mib(cold["rss_kib"]),
            mib(cold["rss_peak"]["rss_kib"]),
            "",
            "",
            "",
        ),
        (
            "  2 s later: VmRSS (VmHWM)",
            mib(cold["memory_2s_later"]["VmRSS"]),
            mib(cold["memory_2s_later"]["VmHWM"]),
            "",
            f"<={GOALS['peak_mib']} MiB",
            verdict(cold["memory_2s_later"].get("VmHWM"), GOALS["peak_mib"] * 1024),
        ),
        *kernel_lines("one endpoint changed -> in the kernel", sc["update"]),
        *kernel_lines("one Service created -> in the kernel", sc["create"], GOALS["create_ms"]),
    ]


#: Goals at 10k Services x 5 endpoints: pycnid's VmRSS once programmed, a restarted pycnid's
#: peak (VmHWM) up to 2 s after it programmed them, a created Service in the kernel (p50, max).
GOALS = {"rss_mib": 150, "peak_mib": 200, "create_ms": (20, 50)}


def verdict(value: float | None, limit: float) -> str:
    return "" if value is None else ("PASS" if value <= limit else "MISS")


def kernel_lines(label: str, figures: dict, goals: tuple[int, int] | None = None) -> list[Line]:
    n = len(figures["runs"])
    late = f"{figures['timeouts']} timed out" if figures["timeouts"] else ""
    p50, top = goals or (None, None)
    return [
        (f"{label}, p50 of {n}", ms(figures["p50"]), late, "", *goal_cells(figures["p50"], p50)),
        ("  max", ms(figures["max"]), "", "", *goal_cells(figures["max"], top)),
    ]


def goal_cells(seconds: float | None, limit_ms: int | None) -> tuple[str, str]:
    if limit_ms is None:
        return "", ""
    return f"<={limit_ms} ms", verdict(seconds, limit_ms / 1000) if seconds is not None else "MISS"


def render(report: dict, sections: list[tuple[str, list[Line]]]) -> str:
    return render_goal_table("bench-svc-e2e", report, sections, "before", (14, 14))


def run(
    args: argparse.Namespace, box: Sandbox, cni_bin: str, report: dict
) -> list[tuple[str, list[Line]]]:
    built = start_cluster(
        "vxlan",
        2,
        cni_bin,
        cidr="10.134.0.0/16",
        daemon={"metricsAddress": METRICS, "services": {"proxy": True, "resyncInterval": 3600}},
    )
    try:
        out = pycni_cli(built.nodes[0], "svc", "config", "set", "--cidr", CIDR)
        if out.returncode != 0:
            raise RuntimeError(f"pycni svc config set: {out.stderr}")
        _, _, poller = setup_pods(box, built)
        print(f"--> create -> connect x {args.reps}", file=sys.stderr, flush=True)
        report["create"] = summarize([measure_create(built, poller, r) for r in range(args.reps)])
        print(
            f"--> {args.services} Services x {args.endpoints} endpoints",
            file=sys.stderr,
            flush=True,
        )
        report["scale"] = measure_scale(
            built, args.services, args.endpoints, args.reps, args.updates, args.timeout
        )
    finally:
        underlay = built.cluster.underlay
        report["namespaces"] = [underlay.ns.name, *(h.ns.name for h in underlay.hosts)]
        built.cluster.close()
    return [
        (
            "create -> connect (client Pod on node2, backend on node1, vxlan)",
            create_lines(report["create"]),
        ),
        (
            f"{args.services} Services x {args.endpoints} endpoints, pycnid on node2",
            scale_lines(report["scale"]),
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    return run_sandboxed("svc-e2e", parse_args(argv), run, render)


if __name__ == "__main__":
    sys.exit(main())

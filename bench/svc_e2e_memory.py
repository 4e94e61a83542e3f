"""Where a restarted pycnid's first pass goes, in one process (no pycnid, no etcd): the records
bench/svc_e2e.py writes, decoded the way a watch snapshot is (``Records.replace_all``), then the
steps of ``ProxySync.sync`` timed one by one, with VmRSS after each and, with ``--trace``,
tracemalloc's current/peak (slower: figures then are for memory only); the full renders run in a
child ``nft -f -`` as pycnid runs them (``Nft.run_apart``); that child's own peak is measured once
more by a small parent (``nft_peak_mib``: a child's ru_maxrss starts from its parent's at exec).

    python3 -m bench.svc_e2e_memory [--services 10000] [--endpoints 5] [--trace]

Runs its kernel steps in a netns of its own (made and deleted here): the full render into an
empty table, then again into the table it holds (what a restart meets), release_cache, GC."""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator

from common.collector import paused_gc
from kernel.nft import Nft
from services.proxy.sync import calc_plan
from services.proxy.table import ServiceTable
from services.proxy.view import PREFIXES, Records
from store.base import KV

from .common import vm_rss_kib
from .svc_e2e_load import calc_bulk_service


def calc_kvs(services: int, per_service: int) -> list[KV]:
    return [KV(k, v, 1) for i in range(services) for k, v in calc_bulk_service(i, per_service)]


def iter_kvs(services: int, per_service: int, prefix: str) -> Iterator[KV]:
    """The records under ``prefix`` as they come, never all at once (etcd's pages)."""
    for i in range(services):
        for k, v in calc_bulk_service(i, per_service):
            if k.startswith(prefix):
                yield KV(k, v, 1)


def load_paged(records: Records, services: int, per_service: int) -> None:
    for prefix in PREFIXES:
        records.replace_all(iter_kvs(services, per_service, prefix), prefix)


class Steps:
    """Each step's seconds, VmRSS after it, and tracemalloc's (current, peak) MiB if tracing."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def run(self, name: str, fn, *args):
        if tracemalloc.is_tracing():
            tracemalloc.reset_peak()
        started = time.perf_counter()
        result = fn(*args)
        row = {
            "step": name,
            "seconds": time.perf_counter() - started,
            "rss_mib": (vm_rss_kib(os.getpid()) or 0) / 1024,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        if tracemalloc.is_tracing():
            current, peak = tracemalloc.get_traced_memory()
            row.update(traced_mib=current / 2**20, peak_mib=peak / 2**20)
        self.rows.append(row)
        return result


def load(records: Records, kvs: list[KV]) -> None:
    for prefix in PREFIXES:
        records.replace_all([kv for kv in kvs if kv.key.startswith(prefix)], prefix)


def full_plan(records: Records):
    with paused_gc():
        return calc_plan(records, "node2", 4, [], None, set(records.services))


def commit(plan) -> ServiceTable:
    table = ServiceTable(4)
    with paused_gc():
        table.commit(plan)
    return table


def measure(services: int, per_service: int) -> list[dict]:
    steps, records, nft = Steps(), Records(), Nft()
    steps.run("baseline", lambda: None)
    steps.run(
        "Records.replace_all page by page (decode + index)",
        load_paged,
        records,
        services,
        per_service,
    )
    plan = steps.run("full plan (views, elements, script)", full_plan, records)
    steps.run("nft.run_apart into an empty table", nft.run_apart, plan.script)
    nft_peak = steps.run("nft -f - again, from a small parent", calc_nft_peak, plan.script)
    table = steps.run("table.commit", commit, plan)
    steps.run("release_cache + malloc_trim", nft.release_cache)
    del plan
    steps.run("plan dropped, gc.collect()", gc.collect)
    again = steps.run("full plan again (a restart)", full_plan, records)
    steps.run("nft.run_apart into the table it holds", nft.run_apart, again.script)
    steps.run("table.commit", commit, again)
    steps.run("release_cache + malloc_trim", nft.release_cache)
    del again, table
    steps.run("plan dropped, gc.collect()", gc.collect)
    return [
        *steps.rows,
        {"step": "nft -f - of the full render, its own peak", "nft_peak_mib": nft_peak},
    ]


def calc_nft_peak(script: str) -> float:
    """MiB: the peak RSS of ``nft -f -`` running ``script``, under a parent of ~10 MiB."""
    parent = (
        "import resource, subprocess, sys; subprocess.run(['nft', '-f', '-'], check=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", parent], input=script, capture_output=True, text=True
    )
    return int(out.stdout) / 1024 if out.returncode == 0 else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.svc_e2e_memory")
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=5)
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.inside:
        return run_in_fresh_netns(argv or sys.argv[1:])
    if args.trace:
        tracemalloc.start()
    for row in measure(args.services, args.endpoints):
        print(json.dumps(row), flush=True)
    return 0


def run_in_fresh_netns(argv: list[str]) -> int:
    name = f"pycnimem-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        cmd = [
            "ip",
            "netns",
            "exec",
            name,
            sys.executable,
            "-m",
            "bench.svc_e2e_memory",
            "--inside",
            *argv,
        ]
        return subprocess.run(cmd).returncode
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


if __name__ == "__main__":
    sys.exit(main())

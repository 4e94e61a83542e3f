"""Where a restarted pycnid's first pass goes, in one process (no pycnid, no etcd): the records
bench/svc_e2e.py writes, decoded the way a watch snapshot is (``Records.replace_all``), then the
steps of ``ProxySync.sync`` timed one by one, with VmRSS after each and, with ``--trace``,
tracemalloc's current/peak (slower: figures then are for memory only).

    python3 -m bench.svc_e2e_memory [--services 10000] [--endpoints 5] [--trace]

Runs its kernel steps in a netns of its own (made and deleted here): the full render into an
empty table, then again into the table it holds (what a restart meets), release_cache, GC."""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc

from kernel.nft import Nft
from services.proxy.sync import calc_plan, paused_gc
from services.proxy.table import ServiceTable
from services.proxy.view import PREFIXES, Records
from store.base import KV

from .common import vm_rss_kib
from .svc_e2e_load import calc_bulk_service


def calc_kvs(services: int, per_service: int) -> list[KV]:
    return [KV(k, v, 1) for i in range(services) for k, v in calc_bulk_service(i, per_service)]


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
    kvs = steps.run("records as KVs (the range response)", calc_kvs, services, per_service)
    steps.run("Records.replace_all (decode + index)", load, records, kvs)
    del kvs
    plan = steps.run("full plan (views, elements, script)", full_plan, records)
    steps.run("nft.run into an empty table", nft.run, plan.script)
    table = steps.run("table.commit", commit, plan)
    steps.run("release_cache + malloc_trim", nft.release_cache)
    del plan
    steps.run("plan dropped, gc.collect()", gc.collect)
    again = steps.run("full plan again (a restart)", full_plan, records)
    steps.run("nft.run into the table it holds", nft.run, again.script)
    steps.run("table.commit", commit, again)
    steps.run("release_cache + malloc_trim", nft.release_cache)
    del again, table
    steps.run("plan dropped, gc.collect()", gc.collect)
    return steps.rows


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

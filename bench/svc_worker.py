"""One measurement of `make bench-svc`, run inside a fresh netns the driver made (bench/svc.py).

    ip netns exec NS python3 -m bench.svc_worker --shape pycni|kube --engine lib|bin
                                                 --services N [--mix mixed|mixed-2aff|clusterip]
                                                 [--updates K] [--verify]

A fresh process per (shape, engine, size): the libnftables context, its cache and the kernel
table start empty, so one load does not pay for another. Prints one JSON object: seconds to
render (pycni: the proxy's pass in Python, commit included) and to apply the full sync, the
same for each one-Service update (endpoint 0 of one Service, ``svc_shapes.calc_update_index``,
swapped and back: its endpoint record put, as a watch event delivers it), VmRSS of this process
before the records, holding them, and after the full sync (after ``release_cache``, as pycnid
does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from common.collector import paused_gc
from kernel import nft as nft_mod
from kernel.nft import Nft
from services.proxy.sync import calc_plan, run_plan
from services.proxy.table import ServiceTable, TablePlan
from services.proxy.view import Records

from . import svc_kube as kube
from . import svc_shapes as shapes
from .common import vm_rss_kib

LOCAL = shapes.LOCAL_IPS


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.svc_worker")
    parser.add_argument("--shape", choices=("pycni", "kube"), required=True)
    parser.add_argument("--engine", choices=("lib", "bin"), required=True)
    parser.add_argument("--services", type=int, required=True)
    parser.add_argument("--mix", choices=shapes.MIXES, default="mixed")
    parser.add_argument("--updates", type=int, default=0)
    parser.add_argument(
        "--verify",
        action="store_true",
        help="count the service-ips elements the kernel holds afterwards",
    )
    return parser.parse_args(argv)


def timed(fn, *args) -> tuple[object, float]:
    started = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - started


def sync_pycni(nft: Nft, records: Records, table: ServiceTable | None) -> TablePlan:
    """What pycnid's proxy plans on a pass (services/proxy/sync.py): the dirty Services' views
    from its records (all of them without a table), then the table's plan; a full plan sends
    its early declarations as it goes (``early``), as pycnid's does."""
    dirty = records.take_dirty()
    return calc_plan(records, shapes.NODE.node, 4, LOCAL, table, dirty, early=nft.start_apart)


def measure_pass(
    nft: Nft, records: Records, table: ServiceTable, committed: bool
) -> tuple[TablePlan, float, float]:
    """One pass as ProxySync.sync makes it, the collector paused from plan to commit (its
    due collection comes after, in pycnid as here): (plan, Python seconds, nft seconds)."""
    with paused_gc():
        plan, render = timed(sync_pycni, nft, records, table if committed else None)
        _, apply = timed(run_plan, nft, plan)
        _, commit = timed(table.commit, plan)
    return plan, render + commit, apply


def measure_pycni(nft: Nft, plan: shapes.Plan, updates: int) -> dict:
    rss_base = vm_rss_kib(os.getpid())
    records, build = timed(shapes.build_records, plan)
    rss_built = vm_rss_kib(os.getpid())
    table = ServiceTable(4)
    full, render, apply = measure_pass(nft, records, table, committed=False)
    nft.release_cache()  # as pycnid does after a full render
    rss_synced = vm_rss_kib(os.getpid())
    rounds, committed = [], plan
    for r in range(1, updates + 1):
        new = shapes.calc_swap(plan, r)
        shapes.swap_records(records, committed, new)  # the watch events, before the pass
        diff, d_render, d_apply = measure_pass(nft, records, table, committed=True)
        rounds.append({"render": d_render, "apply": d_apply, "bytes": len(diff.script)})
        committed = new
    return {
        "build": build,
        "render": render,
        "apply": apply,
        "bytes": len(full.script),
        "elements": len(table.elements()),
        "updates": rounds,
        "rss_kib_base": rss_base,
        "rss_kib_built": rss_built,
        "rss_kib_synced": rss_synced,
    }


def measure_kube(nft: Nft, plan: shapes.Plan, updates: int) -> dict:
    script, render = timed(kube.render_full, plan)
    _, apply = timed(nft.run, script)
    rounds, committed = [], plan
    for r in range(1, updates + 1):
        new = shapes.calc_swap(plan, r)
        diff, d_render = timed(kube.render_update, committed, new)
        _, d_apply = timed(nft.run, diff)
        rounds.append({"render": d_render, "apply": d_apply, "bytes": len(diff)})
        committed = new
    return {
        "render": render,
        "apply": apply,
        "bytes": len(script),
        "updates": rounds,
        "chains": kube.calc_chain_count(plan),
    }


def count_dispatch(shape: str) -> int:
    """Read back through libnftables whatever engine loaded the table (JSON listing)."""
    nft = Nft(prefer_library=True)
    table = "pycni-svc" if shape == "pycni" else "kube-proxy"
    doc = nft.list_json(f"list map ip {table} service-ips")
    maps = [item["map"] for item in doc["nftables"] if "map" in item]
    return len(maps[0].get("elem", [])) if maps else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    nft_mod.TIMEOUT = 1800.0  # pycnid's 30 s bound on `nft -f -`; layout A at 10k takes longer
    nft = Nft(prefer_library=args.engine == "lib")
    plan = shapes.calc_plan(args.services, args.mix)
    measure = measure_pycni if args.shape == "pycni" else measure_kube
    result = {"engine": nft.engine, **measure(nft, plan, args.updates)}
    if args.verify:
        result["service_ips_in_kernel"] = count_dispatch(args.shape)
        result["service_ips_expected"] = shapes.calc_dispatch_count(plan)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

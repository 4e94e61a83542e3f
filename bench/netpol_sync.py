"""One full sync and the label-change passes of `make bench-netpol`, inside a fresh netns the
driver made (bench/netpol.py), through NetworkPolicy's public entry point.

    ip netns exec NS python3 -m bench.netpol_sync --policies P --pods N --local L
                                                  --labels K --store PATH

The synthetic records (bench/netpol_records.py) go into a SQLite store first; then a
``NetpolSync`` for the measured node starts as pycnid starts it, and its own histogram
``pycni_netpol_sync_seconds`` (render + apply of one pass, ``netpol/sync.py``) gives each
pass's time: the first pass is the full sync into an empty table; then ``--labels`` times a
Pod's labels change (its endpoint record put, as pycni-svc writes it), alternately a Pod of
this node (its isolation changes) and a Pod of another node (peer sets change, if it is a peer
of a policy active here), and the pass that follows is timed. Whatever the sync
does per pass (a full render, element diffs) is what is measured. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from common.metrics import Registry
from netpol.sync import NetpolSync
from store.base import Put
from store.sqlite import SqliteStore
from tests.fixtures.daemon import parse_samples

from . import netpol_records as records

HISTOGRAM = "pycni_netpol_sync_seconds"
PASS_TIMEOUT = 600.0
#: Another node's Pod may be a peer of no policy active here: no pass follows (SQLite's revision
#: is looked at every ``netpol.sync.POLL`` seconds), and the change is reported untimed.
NO_CHANGE = 5.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.netpol_sync")
    parser.add_argument("--policies", type=int, required=True)
    parser.add_argument("--pods", type=int, required=True)
    parser.add_argument("--local", type=int, required=True)
    parser.add_argument("--labels", type=int, default=10, help="label changes timed")
    parser.add_argument("--store", required=True, help="SQLite file to create")
    parser.add_argument(
        "--no-change-wait", type=float, default=NO_CHANGE, help="seconds to wait for no pass"
    )
    return parser.parse_args(argv)


def passes(registry: Registry) -> tuple[int, float]:
    """(passes observed, their seconds summed) from the sync's histogram."""
    samples = parse_samples(registry.render())
    return int(samples.get(f"{HISTOGRAM}_count", 0)), samples.get(f"{HISTOGRAM}_sum", 0.0)


def wait_pass(registry: Registry, seen: int, timeout: float) -> tuple[int, float] | None:
    """Until a pass beyond ``seen`` is observed: (count, sum); None after ``timeout`` (the
    sync observes only passes that changed the table)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        count, total = passes(registry)
        if count > seen:
            return count, total
        time.sleep(0.005)
    return None


def pick_pod(sizes: records.Sizes, r: int, local: bool) -> int:
    """The ``r``-th Pod of this node (``local``), or of another node that is a peer of a
    policy active here (``peer_candidates``; any other node's Pod if there is none), cycling."""
    found = peer_candidates(sizes) if not local else []
    found = found or [j for j in range(sizes.pods) if is_local(sizes, j) == local]
    return found[r % len(found)] if found else 0


def is_local(sizes: records.Sizes, j: int) -> bool:
    return records.node_of(sizes, j) == sizes.node


def peer_candidates(sizes: records.Sizes) -> list[int]:
    """Other nodes' Pods in the namespaces where a first-kind policy (ingress from
    ``tier: web`` of its namespace) selects a Pod of this node: their tier change moves them
    in or out of that policy's peers."""
    active = {j % records.NAMESPACES for j in range(sizes.pods) if selected_here(sizes, j)}
    return [
        j for j in range(sizes.pods) if j % records.NAMESPACES in active and not is_local(sizes, j)
    ]


def selected_here(sizes: records.Sizes, j: int) -> bool:
    """Pod ``j`` is of this node and a first-kind policy of its namespace selects it."""
    labels, ns = records.calc_labels(j), j % records.NAMESPACES
    kinds = range(ns, sizes.policies, records.NAMESPACES)
    return is_local(sizes, j) and any(
        k % len(records.KINDS) == 0 and records.calc_policy(k).pod_selector.matches(labels)
        for k in kinds
    )


def relabel(store: SqliteStore, sizes: records.Sizes, j: int, local: bool) -> None:
    """Pod ``j`` relabelled: a local one gets ``app: a0`` (selected by its namespace's first
    policy) or, if it has it, another app (selected by none): its isolation changes; another
    node's Pod changes tier (web <-> api): it enters or leaves peer sets."""
    labels = records.calc_labels(j)
    if local:
        labels["app"] = "zz" if labels["app"] == "a0" else "a0"
    else:
        labels["tier"] = "api" if labels["tier"] == "web" else "web"
    pod = records.calc_pod(sizes, j, labels)
    store.txn([], [Put(pod.key, pod.to_bytes())])


def measure(args: argparse.Namespace) -> dict:
    sizes = records.Sizes(args.policies, args.pods, args.local, "bench-node")
    store = SqliteStore(args.store)
    written = records.write_records(store, records.iter_records(sizes))
    registry = Registry()
    sync = NetpolSync(sizes.node, store, registry, resync_interval=3600.0).start()
    try:
        first = wait_pass(registry, 0, PASS_TIMEOUT)
        if first is None:
            raise RuntimeError(f"no NetworkPolicy pass within {PASS_TIMEOUT:g}s")
        count, total = first
        out: dict = {"records": written, "full": total, "labels": []}
        for r in range(args.labels):
            local = r % 2 == 0
            relabel(store, sizes, pick_pod(sizes, r // 2, local), local)
            quiet = args.no_change_wait + 2 * out["full"]  # a pass takes about a full sync
            found = wait_pass(registry, count, PASS_TIMEOUT if local else quiet)
            seconds = None if found is None else found[1] - total
            out["labels"].append({"local": local, "seconds": seconds})
            count, total = found or (count, total)
        return out
    finally:
        sync.stop()
        store.close()


def main(argv: list[str] | None = None) -> int:
    json.dump(measure(parse_args(argv)), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`pycni ipam gc`: the dead-node reaper (``nodes.reaper``), then check's fixes until none is left.

The reaper runs first (a dead node's handles are released whole, by its rules: heartbeat gone
for the grace period, confirmed on a second look), on stores with heartbeats (etcd) only, as
in pycnid (``nodes.liveness.supports_leases``). Then rounds of check + fixes: a fix can
uncover the next (an orphan handle deleted leaves its allocations orphan, freed in the next
round, and then the empty orphan block is deleted). ``--dry-run`` reports one round and writes
nothing.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from cli.command import Env, Failed
from cli.open_store import load_config
from ipam.ops.check import find_problems
from ipam.ops.repair import apply_fix, read_snapshot
from nodes.liveness import supports_leases
from nodes.reaper import reap_dead_nodes

MAX_ROUNDS = 5


def calc_grace(env: Env, grace: float | None) -> float:
    if grace is None:
        return load_config(env.opts, sections=True).node.reap_grace
    if grace < 0:
        raise Failed(f"invalid --grace {grace:g}", "expected seconds >= 0")
    return grace


def run_reaper(env: Env, dry_run: bool, grace: float | None) -> dict[str, Any]:
    if not supports_leases(env.store()):  # SQLite (one node): every node would look dead
        why = f"store {env.store_name} keeps no node heartbeats (one node)"
        return {"available": False, "summary": f"not run: {why}", "nodes": [], "errors": []}
    seconds = calc_grace(env, grace)
    report = reap_dead_nodes(env.store(), time.time(), seconds, dry_run=dry_run)
    doc = report.to_dict()
    states = Counter(v["state"] for v in doc["nodes"])
    summary = ", ".join(f"{n} node(s) {s}" for s, n in sorted(states.items())) or "no nodes"
    if doc["errors"]:
        summary += f"; {len(doc['errors'])} error(s): {'; '.join(doc['errors'])}"
    return {"available": True, "grace": seconds, "summary": summary, **doc}


def run_gc(env: Env, dry_run: bool, grace: float | None) -> dict[str, Any]:
    reaper = run_reaper(env, dry_run, grace)
    store = env.store()
    done: list[dict[str, Any]] = []
    findings = find_problems(read_snapshot(store))
    for _ in range(MAX_ROUNDS):
        todo = [(finding, fix) for finding in findings for fix in finding.fixes]
        if not todo:
            break
        applied = 0
        for finding, fix in todo:
            status, detail = ("planned", "") if dry_run else apply_fix(store, fix, time.time())
            applied += status == "applied"
            done.append(
                {
                    "kind": finding.kind,
                    "problem": finding.message,
                    "action": fix.action,
                    "ip": fix.ip,
                    "handle": fix.handle,
                    "key": fix.block_key or finding.key,
                    "status": status,
                    "detail": detail,
                }
            )
        if dry_run or not applied:
            break
        findings = find_problems(read_snapshot(store))
    remaining = [f for f in findings if not f.fixes] if dry_run else findings
    return {
        "dryRun": dry_run,
        "fixes": done,
        "remaining": [f.to_dict() for f in remaining],
        "reaper": reaper,
    }

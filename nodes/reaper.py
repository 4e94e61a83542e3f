"""Reclaiming a dead node's addresses: ``release_node`` (operator) and ``reap_dead_nodes`` (GC).

``release_node(store, node)`` releases every handle whose attribute ``node`` is NODE (its
outage buffers ``_buffer/<node>/<pool>`` included) and then returns the node's empty blocks to
their pool. Each release is one txn comparing the handle's and every touched block's
``mod_revision`` plus *guards*: the heartbeat key must still be absent (and, for the reaper,
the node record and the suspicion unchanged), so a node that comes back mid-way stops the
reclamation at the next txn. A live node (heartbeat present) is refused unless ``force``.

``reap_dead_nodes(store, now, grace)`` is what every GC runs (the CNI GC verb on any node,
``pycni ipam gc``, and pycnid's periodic reaper). It never reclaims on one observation:

1. heartbeat absent, no suspicion: record ``/pycni/v1/reaper/suspects/<node>`` = {"since": now,
   "revision": r} in a txn that also compares the heartbeat absent (first look);
2. heartbeat present again, or the node record rewritten after ``r`` (the node re-announced
   itself, maybe between two passes): the suspicion is cleared / restarted;
3. heartbeat still absent ``grace`` seconds after ``since`` (second look): ``release_node``
   guarded by the heartbeat, the node record and the suspicion; then the node record and the
   suspicion go.

A partitioned node is therefore never reclaimed before its heartbeat has been gone for the
whole grace period (keep it well above the longest etcd outage nodes should ride out). A store
without leases (SQLite, one node) has no heartbeats, so the reaper never acts on it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cni.spec.errors import CNIError, InvalidConfig
from common.loop import Errors, Periodic
from common.metrics import Registry
from nodes.liveness import supports_leases
from nodes.reclaim import GuardFailed, ReleaseReport, release_node_handles, return_empty_blocks
from nodes.record import heartbeat_key, node_key
from store.base import KV, Compare, Delete, Put, Store
from store.codec import decode, encode
from store.keys import AFFINITY, HEARTBEATS, NODES, SUSPECTS, proxy_inputs_key

log = logging.getLogger("pycnid.reaper")


def suspect_key(node: str) -> str:
    return f"{SUSPECTS}{node}"


class NodeIsAlive(InvalidConfig):
    """release-node asked for a node whose heartbeat is present (use force to override)."""


def release_node(
    store: Store,
    node: str,
    *,
    force: bool = False,
    guards: Sequence[Compare] = (),
    dry_run: bool = False,
) -> ReleaseReport:
    """Release every handle of ``node`` and return its empty blocks (see the module doc)."""
    beat = store.get(heartbeat_key(node))
    if beat is not None and not force:
        raise NodeIsAlive(
            f"node {node} is alive (its heartbeat {beat.key} exists)",
            "stop its pycnid first, or force the release",
        )
    guards = list(guards) if force else [Compare(heartbeat_key(node), 0), *guards]
    report = ReleaseReport(node)
    try:
        release_node_handles(store, node, guards, report, dry_run)
        return_empty_blocks(store, node, guards, report, dry_run)
    except GuardFailed as exc:
        report.stopped = str(exc)
    return report


@dataclass
class NodeVerdict:
    node: str
    state: str  # alive | cleared | suspect | raced | waiting | reaped | stopped
    since: float | None = None
    release: ReleaseReport | None = None

    def to_dict(self) -> dict:
        out: dict = {"node": self.node, "state": self.state}
        if self.since is not None:
            out["since"] = self.since
        if self.release is not None:
            out["release"] = self.release.to_dict()
        return out


@dataclass
class ReapReport:
    nodes: list[NodeVerdict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped: str = ""  # why no node was looked at

    def to_dict(self) -> dict:
        out = {"nodes": [v.to_dict() for v in self.nodes], "errors": list(self.errors)}
        return {**out, "skipped": self.skipped} if self.skipped else out

    @property
    def reaped(self) -> list[str]:
        return [v.node for v in self.nodes if v.state == "reaped"]


def node_names(store: Store, prefix: str) -> set[str]:
    """The node names a keys-only range finds right under ``prefix`` (``<prefix><node>/...``)."""
    return {kv.key[len(prefix) :].split("/", 1)[0] for kv in store.range(prefix, keys_only=True)}


def calc_candidates(store: Store, skip: str | None) -> set[str]:
    """Every node the store mentions: node records, affinity index entries (blocks), and
    suspicions; keys only, so a pass costs little while every node is alive."""
    nodes = node_names(store, NODES) | node_names(store, AFFINITY) | node_names(store, SUSPECTS)
    nodes.discard("")
    nodes.discard(skip or "")
    return nodes


def reap_dead_nodes(
    store: Store, now: float, grace: float, *, self_node: str | None = None, dry_run: bool = False
) -> ReapReport:
    """One reaper pass over every node but ``self_node``; errors are collected per node.
    A store without leases (SQLite) has no heartbeats: every node would look dead, so the
    pass does nothing there."""
    report = ReapReport()
    if not supports_leases(store):
        report.skipped = f"the store {store.name} has no heartbeats (single node): no reaping"
        return report
    beating, suspects = node_names(store, HEARTBEATS), node_names(store, SUSPECTS)
    for node in sorted(calc_candidates(store, self_node)):
        if node in beating and node not in suspects:
            report.nodes.append(NodeVerdict(node, "alive"))
            continue
        try:
            report.nodes.append(judge_node(store, node, now, grace, dry_run))
        except CNIError as exc:
            report.errors.append(f"{node}: {exc}")
    for verdict in report.nodes:
        if verdict.state in ("reaped", "stopped"):
            log.warning(
                "reaper: node %s %s: %s",
                verdict.node,
                verdict.state,
                verdict.release.summary() if verdict.release else "",
            )
    return report


def judge_node(store: Store, node: str, now: float, grace: float, dry_run: bool) -> NodeVerdict:
    """One look at one node; see the module doc for the steps."""
    suspect = store.get(suspect_key(node))
    record = store.get(node_key(node))
    record_rev = record.mod_revision if record else 0
    if store.get(heartbeat_key(node)) is not None:
        if suspect is not None and not dry_run:
            store.txn([Compare(suspect.key, suspect.mod_revision)], [Delete(suspect.key)])
        return NodeVerdict(node, "alive" if suspect is None else "cleared")
    seen = decode(suspect.key, suspect.value) if suspect else None
    if suspect is None or seen is None or record_rev > int(seen.get("revision") or 0):
        return first_look(store, node, now, record_rev, suspect, dry_run)
    since = float(seen.get("since") or now)
    if now - since < grace:
        return NodeVerdict(node, "waiting", since)
    guards = [Compare(node_key(node), record_rev), Compare(suspect.key, suspect.mod_revision)]
    release = release_node(store, node, guards=guards, dry_run=dry_run)
    if release.stopped:
        return NodeVerdict(node, "stopped", since, release)
    if not dry_run and release.complete and not release.cooling:
        forget_node(store, node, guards)  # else a later pass returns the cooling blocks
    return NodeVerdict(node, "reaped", since, release)


def first_look(
    store: Store, node: str, now: float, record_rev: int, suspect: KV | None, dry_run: bool
) -> NodeVerdict:
    """Record (or restart) the suspicion, in a txn that also finds the heartbeat absent."""
    if dry_run:
        return NodeVerdict(node, "suspect", now)
    compares = [
        Compare(heartbeat_key(node), 0),
        Compare(node_key(node), record_rev),
        Compare(suspect_key(node), suspect.mod_revision if suspect else 0),
    ]
    value = encode({"node": node, "since": now, "revision": max(record_rev, store.revision())})
    result = store.txn(compares, [Put(suspect_key(node), value)])
    return NodeVerdict(node, "suspect" if result.succeeded else "raced", now)


def forget_node(store: Store, node: str, guards: Sequence[Compare]) -> None:
    """After a complete reclamation: drop the node record, the suspicion and what its Service
    proxy published (guarded)."""
    compares = [Compare(heartbeat_key(node), 0), *guards]
    deletes = [Delete(node_key(node)), Delete(suspect_key(node)), Delete(proxy_inputs_key(node))]
    store.txn(compares, deletes)


class ReaperLoop:
    """pycnid's periodic reaper: a pass every ``interval`` seconds (first after one interval)."""

    def __init__(
        self,
        store: Store,
        node: str,
        grace: float,
        interval: float,
        clock: Callable[[], float] = time.time,
        on_pass: Callable[[ReapReport], None] | None = None,
        registry: Registry | None = None,
    ) -> None:
        self.store, self.node, self.grace, self.interval = store, node, grace, interval
        self.clock = clock
        self.on_pass = on_pass or (lambda report: None)
        self.loop = Periodic(
            "ipam-reaper",
            interval,
            self.run_pass,
            first=interval,
            errors=Errors(log, "reaper pass skipped", logging.INFO),
            registry=registry,
        )

    def start(self) -> ReaperLoop:
        if self.interval > 0:
            self.loop.start()
        return self

    def run_pass(self) -> None:
        self.on_pass(reap_dead_nodes(self.store, self.clock(), self.grace, self_node=self.node))

    def stop(self) -> None:
        self.loop.stop()

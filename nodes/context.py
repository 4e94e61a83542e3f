"""The node's context around the IPAM store, as pycnid hands it to plugin handlers.

``NodeContext`` holds this node's liveness, and for a store with leases (etcd) the tracked
store, the reaper and the outage guard; pycnid's start-up builds it (``pycnid/wiring.py``).
With SQLite there is no heartbeat, no reaper and no guard (``NoGuard``): the store is local and
the only node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from common.metrics import Counter, Registry
from ipam.outage.guard import NoGuard, OutageGuard
from nodes.liveness import Liveness
from nodes.options import NodeOptions
from nodes.reaper import ReaperLoop, ReapReport, reap_dead_nodes
from store.base import Store


@dataclass
class NodeContext:
    options: NodeOptions
    raw_store: Store
    store: Store  # what the lease service uses (tracked when the store can be unreachable)
    liveness: Liveness
    reaper: ReaperLoop | None = None
    guard: OutageGuard | NoGuard = field(default_factory=NoGuard)
    metrics: dict[str, Counter] | None = None  # reaper_metrics

    def reap(self) -> ReapReport | None:
        """One reaper pass (the CNI GC verb runs it); None without heartbeats (SQLite)."""
        if self.reaper is None:
            return None
        report = reap_dead_nodes(
            self.raw_store,
            time.time(),
            self.options.reap_grace,
            self_node=self.liveness.record.name,
        )
        self.count(report)
        return report

    def count(self, report: ReapReport) -> None:
        if self.metrics is None:
            return
        for verdict in report.nodes:
            if verdict.release is not None:
                self.metrics["addresses"].inc(len(verdict.release.released_ips))
            if verdict.state == "reaped":
                self.metrics["nodes"].inc()


def reaper_metrics(registry: Registry) -> dict[str, Counter]:
    return {
        "nodes": registry.counter(
            "pycni_ipam_reaped_nodes_total", "Dead nodes whose addresses the reaper reclaimed"
        ),
        "addresses": registry.counter(
            "pycni_ipam_reaped_addresses_total", "Addresses released from dead nodes"
        ),
    }

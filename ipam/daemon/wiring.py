"""Wiring in pycnid: node liveness, the outage guard and the reaper around the IPAM store.

``setup_node`` runs first (before the lease service exists): it announces the node
(``ipam/nodes/liveness.py``) and, for a store with leases (etcd), starts the periodic reaper and
wraps the store in a ``TrackedStore`` for the lease service. ``setup_guard`` then puts the
outage guard around that lease service. With SQLite there is no heartbeat, no reaper and no
guard (``NoGuard``): the store is local and the only node.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ipam.leases.service import LeaseService
from ipam.nodes.liveness import Liveness, NodeRecord, supports_leases
from ipam.nodes.options import NodeOptions, parse_node_options
from ipam.outage.guard import NoGuard, OutageGuard
from ipam.outage.files import OutageFiles
from ipam.outage.store import TrackedStore
from ipam.nodes.reaper import ReapReport, ReaperLoop, reap_dead_nodes
from ipam.store.base import Store

log = logging.getLogger("pycnid.ipam")


@dataclass
class NodeServices:
    options: NodeOptions
    raw_store: Store
    store: Store  # what the lease service uses (tracked when the store can be unreachable)
    liveness: Liveness
    reaper: ReaperLoop | None = None
    guard: Any = field(default_factory=NoGuard)  # OutageGuard | NoGuard
    metrics: Any = None

    def reap(self) -> ReapReport | None:
        """One reaper pass (the CNI GC verb runs it); None without heartbeats (SQLite)."""
        if self.reaper is None:
            return None
        report = reap_dead_nodes(self.raw_store, time.time(), self.options.reap_grace,
                                 self_node=self.liveness.record.name)
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


def setup_node(services: Any, config: Any, store: Store) -> NodeServices:
    endpoints = tuple(config.store.endpoints) if config.store.type == "etcd" else ()
    options = parse_node_options(getattr(config, "raw", {}) or {}, endpoints)
    record = NodeRecord(services.node_name, options.address, options.labels, time.time())
    liveness = Liveness(store, record, options.heartbeat_ttl).start()
    services.on_shutdown.append(liveness.stop)
    if not supports_leases(store):
        return NodeServices(options, store, store, liveness)
    node = NodeServices(options, store, TrackedStore(store), liveness,
                        metrics=reaper_metrics(services.metrics))
    node.reaper = ReaperLoop(store, services.node_name, options.reap_grace,
                             options.reap_interval, on_pass=node.count).start()
    services.on_shutdown.append(node.reaper.stop)
    return node


def setup_guard(node: NodeServices, services: Any, config: Any, leases: LeaseService) -> Any:
    """The outage guard for the lease service (started: it replays a leftover journal)."""
    if not isinstance(node.store, TrackedStore):
        return node.guard
    files = OutageFiles(config.state_dir, services.node_name)
    node.guard = OutageGuard(leases, files, size=node.options.buffer_size,
                             budget=node.options.add_budget, metrics=services.metrics)
    node.guard.load().start()
    services.on_shutdown.append(node.guard.stop)
    return node.guard


def reaper_metrics(registry: Any) -> dict[str, Any]:
    return {"nodes": registry.counter("pycni_ipam_reaped_nodes_total",
                                      "Dead nodes whose addresses the reaper reclaimed"),
            "addresses": registry.counter("pycni_ipam_reaped_addresses_total",
                                          "Addresses released from dead nodes")}

"""The overlay sync's metrics on pycnid's registry (served at ``metricsAddress``)."""

from __future__ import annotations

from common.metrics import Registry
from overlay import dataplane
from overlay.model import Plan


class OverlayMetrics:
    def __init__(self, registry: Registry) -> None:
        self.peers = registry.gauge("pycni_overlay_peers", "remote nodes in the overlay")
        self.unreachable = registry.gauge(
            "pycni_overlay_unreachable_peers", "host-gw peers not on a connected subnet"
        )
        self.entries = registry.gauge(
            "pycni_overlay_entries", "routes, neighbours and FDB entries programmed"
        )
        self.failures = registry.counter(
            "pycni_overlay_apply_failures_total", "entries the kernel refused"
        )
        self.events = registry.counter(
            "pycni_overlay_registry_events_total", "registry changes that woke the overlay sync"
        )
        self.kernel_events = registry.counter(
            "pycni_overlay_kernel_events_total",
            "kernel changes (pycni's entries deleted, gateways added) that woke the sync",
        )
        self.seconds = registry.histogram(
            "pycni_overlay_sync_seconds", "time of one overlay reconcile pass"
        )

    def observe(self, plan: Plan, outcome: dataplane.Outcome, peers: int, took: float) -> None:
        self.peers.set(peers)
        self.unreachable.set(len(plan.unreachable))
        for kind in ("routes", "neighs", "fdbs"):
            self.entries.set(len(getattr(plan.entries, kind)), kind=kind)
        if outcome.failed:
            self.failures.inc(len(outcome.failed))
        self.seconds.observe(took)

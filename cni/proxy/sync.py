"""The Service proxy in pycnid: Service records in, one nftables transaction per change out.

``ProxySync.start()`` returns at once; a loop thread (``ipam/loop.py``) then, on every pass:

1. reads the prefixes ``view.PREFIXES`` (services, endpoints, pools, service settings, node
   records) and watches each from the revision it read (etcd; SQLite is re-read each pass);
2. builds each family's model (``view.calc_model``) and applies
   ``render_transaction(committed, new)`` through one kept libnftables context: element diffs
   against the last committed model, never a listing of the table. A full render comes at
   start, after a refused transaction (the committed model is then unknown: None) and every
   ``resyncInterval`` seconds;
3. deletes stale UDP conntrack entries of the entry points whose serving backends changed
   (``conntrack.py``).

A family gets its table once the service settings hold a CIDR of it or a Service has a VIP of
it. Nothing is programmed before the first complete read (an empty view must not reject every
Service). Metrics: sync seconds, Services programmed, refused transactions.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from cni.net.nft import Nft, NftError
from cni.net.session import node_session
from cni.spec.errors import CNIError
from ipam.loop import Errors, Loop
from ipam.store.watched import WatchedPrefixes
from . import conntrack
from .elements import render_transaction
from .model import ProxyModel
from .view import PREFIXES, Records, calc_model

log = logging.getLogger("pycnid.proxy")
RETRY = 1.0


class ProxyMetrics:
    def __init__(self, registry: Any) -> None:
        self.seconds = registry.histogram("pycni_proxy_sync_seconds",
                                          "time of one Service proxy sync")
        self.services = registry.gauge("pycni_proxy_services",
                                       "Service ports programmed, by family")
        self.failures = registry.counter("pycni_proxy_sync_failures_total",
                                         "nftables transactions the kernel refused")
        self.syncs = registry.counter("pycni_proxy_syncs_total", "proxy syncs applied")
        self.stale = registry.counter("pycni_proxy_conntrack_deleted_total",
                                      "stale UDP conntrack reply sources deleted")


class ProxySync:
    def __init__(self, node: str, store: Any, registry: Any, resync_interval: float) -> None:
        self.node, self.store, self.resync_interval = node, store, resync_interval
        self.records = Records()
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.watched = WatchedPrefixes(store, PREFIXES, self.records, self.lock,
                                       lambda _changed: self.wake.set())
        self.committed: dict[int, ProxyModel | None] = {4: None, 6: None}
        self.full_due = 0.0
        self.nft: Nft | None = None
        self.metrics = ProxyMetrics(registry)
        self.loop = Loop("proxy-sync", self.step, retry=RETRY, wake=self.wake,
                         errors=Errors(log, "proxy sync", expected=(CNIError, NftError)),
                         registry=registry)

    def start(self) -> "ProxySync":
        self.nft = Nft()  # made here: in the node netns
        self.loop.start()
        return self

    def stop(self) -> None:
        self.loop.stop()
        self.watched.cancel()

    def step(self) -> float:
        self.wake.clear()
        self.watched.ensure()
        full = time.monotonic() >= self.full_due
        if full:
            self.committed = {4: None, 6: None}
            self.full_due = time.monotonic() + self.resync_interval
        self.sync()
        return max(0.0, self.full_due - time.monotonic())

    def local_addresses(self) -> list[str]:
        """This node's global addresses (NodePorts answer on them too)."""
        with node_session() as ipr:
            return [a.get_attr("IFA_ADDRESS") for a in ipr.get_addr()
                    if a["scope"] == 0 and a.get_attr("IFA_ADDRESS")]

    def sync(self) -> None:
        started = time.perf_counter()
        local = self.local_addresses()
        with self.lock:
            models = {f: calc_model(self.records, self.node, f, local) for f in (4, 6)}
        for family, model in models.items():
            if self.committed[family] is not None or is_wanted(model):
                self.apply(family, model)
        self.metrics.seconds.observe(time.perf_counter() - started)

    def apply(self, family: int, model: ProxyModel) -> None:
        """One family's transaction; refused, the next pass renders it whole."""
        before = self.committed[family]
        if before == model or self.nft is None:
            return
        try:
            self.nft.run(render_transaction(before, model))
        except NftError as exc:
            self.committed[family] = None
            self.metrics.failures.inc()
            raise NftError(f"IPv{family} Service table refused: {exc}") from None
        self.committed[family] = model
        self.metrics.syncs.inc()
        self.metrics.services.set(len(model.ports), family=f"ipv{family}")
        checks = conntrack.calc_checks(conntrack.calc_udp_serving(before),
                                       conntrack.calc_udp_serving(model), before is None)
        self.metrics.stale.inc(conntrack.clean_stale(checks, family))
        log.info("proxy: IPv%d table %s, %d Service port(s)", family,
                 "rendered" if before is None else "updated", len(model.ports))


def is_wanted(model: ProxyModel) -> bool:
    """A family's table is made once a service CIDR or a VIP of it exists."""
    return bool(model.node.service_cidrs or model.ports)

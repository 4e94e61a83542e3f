"""The overlay sync in pycnid: node registry in, routes / neighbours / FDB entries out.

``OverlaySync.start()`` returns at once; a loop thread (``common/loop.py``) then:

1. leases this node's VTEP addresses (vxlan; retried until a pool can give one) and publishes
   the node record's overlay fields (``Liveness.update``);
2. reads the four registry prefixes (``registry.PREFIXES``) and watches each from the
   revision it read (etcd; SQLite: what changed, each pass) — a watch event wakes the loop;
3. reconciles: desired entries (``model.calc_desired``) against what the kernel holds with
   pycni's marks (``dataplane``), the difference applied, the VXLAN firewall table rendered.

It reconciles on every wake-up, after ``resyncInterval`` seconds without one, and when the
netlink monitor sees one of pycni's entries or its device deleted by someone else — so a
deleted entry is back within about a second. Nothing is removed before the first complete read
of the registry (an empty view must never tear the network down), and nothing follows a
heartbeat: routes follow node records and block affinity only, so an etcd outage changes
nothing. This node's own record is published again when the registry shows it missing or
different (someone removed it while the node runs). Leaving (``setup.py``, ``leaveOnStop``):
the node record goes first, then ``leave()`` releases the VTEP and removes this node's entries;
peers remove theirs on the event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from pyroute2 import IPRoute

from cni.spec.errors import CNIError, TryAgainLater
from common.loop import Errors, Loop
from common.metrics import Registry as MetricsRegistry
from ipam.leases.service import LeaseService
from kernel import monitor
from kernel.addr import ADDR_PROTO_PYCNI
from kernel.monitor import NetlinkMonitor
from kernel.neigh import AF_BRIDGE
from kernel.nft import Nft, NftError
from kernel.route import RTPROT_PYCNI
from kernel.session import node_session
from masq.table import MasqTable
from nodes.record import OverlayInfo
from overlay import dataplane, device, firewall, underlay, vtep
from overlay.metrics import OverlayMetrics
from overlay.model import Local, Plan, calc_desired
from overlay.registry import PREFIXES, Registry
from store.base import Store
from store.watched import WatchedPrefixes

log = logging.getLogger("pycnid.overlay")
RETRY = 1.0


class OverlaySync:
    def __init__(
        self,
        end: device.NodeEnd,
        node: str,
        store: Store,
        leases: LeaseService,
        publish: Callable[[OverlayInfo], None],
        registry: MetricsRegistry,
        masq: MasqTable,
    ) -> None:
        self.end, self.node, self.store, self.leases = end, node, store, leases
        self.publish = publish
        self.masq = masq  # the masquerade table's one writer, pycni-bridge's too
        self.view = Registry()
        self.view.bad.attach(registry)
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.vteps: tuple[str, ...] = ()
        self.vtep_pools_seen: dict[str, str] = {}
        self.published = False
        self.watched = WatchedPrefixes(
            store, PREFIXES, self.view, self.lock, self.on_registry_change
        )
        self.last: Plan | None = None
        self.firewall_script = ""
        self.macs: set[str] = set()  # every VTEP MAC this pycnid put into the FDB
        self.nft: Nft | None = None
        self.metrics = OverlayMetrics(registry)
        self.monitor = NetlinkMonitor(self.on_netlink)
        self.loop = Loop(
            "overlay-sync",
            self.step,
            retry=RETRY,
            wake=self.wake,
            errors=Errors(log, "overlay sync"),
            registry=registry,
        )

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> OverlaySync:
        self.nft = Nft()  # made here: in the node netns
        self.monitor.start()
        self.loop.start()
        return self

    def stop(self) -> None:
        self.loop.stop()
        self.monitor.stop()
        self.watched.cancel()

    def leave(self) -> None:
        """Out of the overlay, once the node record is gone (the caller's, first: peers must
        stop routing to the VTEP before it is released): the VTEP lease, and this node's own
        entries for its peers."""
        if self.end.backend == "vxlan":
            vtep.release_vteps(self.leases, self.node, self.end.config.device_name)
        with node_session() as ipr:
            dataplane.apply_diff(ipr, dataplane.Entries(), self.read_actual(ipr, set()))
        if self.nft is not None and self.end.backend == "vxlan":
            self.nft.run(firewall.render_removal())

    # -- the loop --------------------------------------------------------------------------
    def step(self) -> float:
        """One pass. Nothing is reconciled before the registry was read whole once; after
        that, a store that cannot be reached (VTEP lease, publishing) delays only those: the
        kernel keeps being reconciled with the last view, and the step is retried."""
        self.wake.clear()
        self.watched.ensure()
        try:
            self.ensure_published()
        except CNIError as exc:
            self.reconcile()
            raise exc
        self.reconcile()
        return self.end.config.resync_interval

    def ensure_published(self) -> None:
        with self.lock:
            pools = dict(self.view.pools)
        if not self.vteps or pools != self.vtep_pools_seen:
            self.ensure_vteps()  # a pool of a new family gets its VTEP
            self.vtep_pools_seen = pools
        if not self.published or self.record_differs():
            self.publish(self.info())
            self.published = True

    def record_differs(self) -> bool:
        """This node's record in the registry lacks what it publishes (someone removed or
        rewrote it while this node runs: its peers would drop it)."""
        with self.lock:
            record = self.view.nodes.get(self.node)
        return record is None or record.overlay != self.info()

    def ensure_vteps(self) -> None:
        """A VTEP address per family the pools offer (vxlan); a new one is published."""
        if self.end.backend != "vxlan":
            return
        have = self.vteps or ()
        found = vtep.lease_vteps(
            self.leases,
            self.store,
            self.node,
            self.end.config.device_name,
            self.end.config.vtep_pools,
            have,
        )
        if not found:
            raise TryAgainLater(
                f"no pool offers node {self.node} a VTEP address yet",
                "add a pool (pycni ipam pool add) or name one in overlay.vtepPools",
            )
        if found != have:
            self.vteps, self.published = found, False

    def info(self) -> OverlayInfo:
        cfg = self.end.config
        vxlan = cfg.backend == "vxlan"
        return OverlayInfo(
            cfg.backend,
            self.end.underlay.address,
            self.end.vtep_mac if vxlan else "",
            self.vteps or (),
            cfg.vni if vxlan else 0,
            cfg.port if vxlan else 0,
            self.end.mtu,
        )

    def on_registry_change(self, changed: bool) -> None:
        if changed:
            self.metrics.events.inc()
            self.wake.set()

    def on_netlink(self, kind: str, summary: dict) -> None:
        """Look again now when someone deleted one of pycni's entries or its device, or a
        bridge got a pycni gateway (own borrowed addresses and proxies route through it)."""
        if is_relevant(kind, summary, self.end.config.device_name):
            self.metrics.kernel_events.inc()
            self.wake.set()

    # -- reconcile -------------------------------------------------------------------------
    def reconcile(self) -> Plan:
        started = time.perf_counter()
        with self.lock:
            peers = self.view.peers(self.node)
            own_hosts = self.view.hosts_of(self.node)
        with node_session() as ipr:
            index = self.ensure_local(ipr)
            serving = device.serving_map(ipr, index)
            local = Local(
                self.end.backend,
                index,
                own_hosts,
                lambda ip: device.calc_serving(serving, ip),
                lambda ip: underlay.check_direct(ipr, ip),
                lambda ip: underlay.device_towards(ipr, ip),
            )
            plan = calc_desired(local, peers)
            self.macs |= {f.mac for f in plan.entries.fdbs}  # pycni's, also once it is gone
            outcome = dataplane.apply_diff(ipr, plan.entries, self.read_actual(ipr, self.macs))
        self.ensure_firewall([p.info.underlay for p in peers])
        self.ensure_cluster_cidrs()
        self.report(plan, outcome, len(peers), time.perf_counter() - started)
        return plan

    def ensure_local(self, ipr: IPRoute) -> int:
        if self.end.backend != "vxlan":
            return self.end.underlay.ifindex
        device.ensure_forwarding()
        return device.ensure_device(ipr, self.end, self.vteps or ()).index

    def read_actual(self, ipr: IPRoute, macs: set[str]) -> dataplane.Entries:
        index = None
        if self.end.backend == "vxlan":
            found = [i for i in ipr.link_lookup(ifname=self.end.config.device_name)]
            index = found[0] if found else None
        return dataplane.read_actual(ipr, index, macs)

    def pool_cidrs(self) -> tuple[str, ...]:
        with self.lock:
            return tuple(sorted(set(self.view.pools.values())))

    def ensure_cluster_cidrs(self) -> None:
        """Pod to Pod inside the cluster's pools is never masqueraded: the masquerade
        table's writer holds them as destinations to leave alone (where that table exists)."""
        if self.nft is None:
            return
        try:
            self.masq.ensure_cluster(list(self.pool_cidrs()))
        except (NftError, ValueError) as exc:
            log.warning(
                "overlay: the cluster's pools were not set in the masquerade table: %s", exc
            )

    def ensure_firewall(self, peers: list[str]) -> None:
        if self.nft is None or self.end.backend != "vxlan":
            return
        script = firewall.render_table(self.end.underlay.address, self.end.config.port, peers)
        try:
            self.nft.run(script)
        except NftError as exc:
            log.warning("overlay: the VXLAN firewall table was refused: %s", exc)
            return
        self.firewall_script = script

    def report(self, plan: Plan, outcome: dataplane.Outcome, peers: int, took: float) -> None:
        for failure in outcome.failed:
            log.warning("overlay: %s", failure)
        last = self.last or Plan(dataplane.Entries())
        for peer, why in calc_news(plan.unreachable, last.unreachable).items():
            log.warning(
                "overlay: peer %s gets no route (host-gw needs a directly connected underlay): %s",
                peer,
                why,
            )
        for peer, why in calc_news(plan.skipped, last.skipped).items():
            log.warning("overlay: peer %s is not programmed: %s", peer, why)
        if outcome.changed:
            log.info(
                "overlay: %d peer(s); %d entr(y/ies) added, %d removed in %.1f ms",
                peers,
                outcome.added,
                outcome.removed,
                took * 1000,
            )
        self.last = plan
        self.metrics.observe(plan, outcome, peers, took)


def calc_news(now: Mapping[str, str], before: Mapping[str, str]) -> dict[str, str]:
    """What is new in ``now`` (said once, not on every pass)."""
    return {key: why for key, why in now.items() if before.get(key) != why}


def is_relevant(kind: str, summary: dict, device: str) -> bool:
    if kind == monitor.DELROUTE:
        return summary.get("proto") == RTPROT_PYCNI
    if kind == monitor.DELNEIGH:
        return summary.get("proto") == RTPROT_PYCNI or summary.get("family") == AF_BRIDGE
    if kind == monitor.DELLINK:
        return summary.get("ifname") == device
    if kind == monitor.NEWADDR:
        return summary.get("proto") == ADDR_PROTO_PYCNI
    return kind == monitor.RESUBSCRIBED

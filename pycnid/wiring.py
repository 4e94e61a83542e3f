"""pycnid's start-up wiring: the store, the node's loops on it, then the plugin handlers.

``wire_node`` runs once, in this order, and puts each stop on the shutdown list as soon as the
thing it stops is running (pycnid runs that list in reverse, also after a failed start-up):

1. the store (``store.close``), and for etcd the check that its credentials may read and write
   pycni's prefix: a refused password, permission or certificate fails the start (pycnid exits 1
   naming it); etcd not answering does not (pycnid serves from the outage buffer meanwhile);
2. ``setup_node``: the node announces itself (liveness, ``nodes/liveness.py``) and, for a
   store with leases (etcd), starts the periodic reaper and wraps the store in a
   ``TrackedStore`` for the lease service;
3. the lease service, and ``setup_guard``: the outage guard around it (etcd only; started,
   it replays a leftover journal);
4. the IPAM metrics (their refresh thread when an endpoint serves them), housekeeping, and the
   pool watch (etcd: pool changes reach the cache at once);
5. the overlay (``overlay/setup.py``), when the config has an ``overlay`` section: it
   leases its VTEP addresses through the lease service and publishes them in the node record;
   it sets the cluster's pools in the masquerade table through the table's one writer
   (``masq/table.py``), the one pycni-bridge's ipMasq gets too.
6. the Service proxy (``services/proxy/setup.py``), when ``services.proxy`` is true; with a
   ``kubernetes`` section it follows Services and EndpointSlices on the API server.
7. NetworkPolicy enforcement (``netpol/setup.py``), when ``networkPolicy.enforce`` is true;
   the ADD waits for it to program the new Pod (``HandlerDeps.netpol``): pycni-svc's with the
   store's records, pycni-bridge's with the Kubernetes source;
8. with a ``kubernetes`` section, the one ``KubeSource`` both follow their kinds through
   (``kube/source.py``), started once they asked for them.

Every section comes typed in ``DaemonConfig`` (parsed once at load, ``pycnid/config.py``).

``build_plugins`` then creates every handler this build has, with the one typed ``HandlerDeps``.
A plugin name pycnid has no handler for is not guessed at here: the dispatcher answers it,
code 7 "pycnid serves no plugin '<name>'".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cni.spec.errors import TryAgainLater
from common.metrics import Registry
from ipam.leases.housekeeping import Housekeeping
from ipam.leases.metrics import IpamMetrics, start_ipam_metrics
from ipam.leases.pool_watch import PoolWatch, start_pool_watch
from ipam.leases.service import LeaseService
from ipam.outage.files import OutageFiles
from ipam.outage.guard import OutageGuard
from ipam.outage.store import TrackedStore
from kernel.nft import Nft
from kube.source import KubeSource
from masq.table import MasqTable
from netpol.setup import start_netpol
from nodes.context import NodeContext, reaper_metrics
from nodes.liveness import Liveness, supports_leases, with_announced_overlay
from nodes.options import calc_node_address
from nodes.reaper import ReaperLoop
from nodes.record import NodeRecord
from overlay.setup import start_overlay
from plugins.base import Faults, HandlerDeps, Plugin
from plugins.bridge import plugin as bridge
from plugins.ipam import plugin as ipam
from plugins.svc import plugin as svc
from pycnid.config import DaemonConfig
from services.proxy.setup import start_proxy
from store import open_store
from store.base import Store

log = logging.getLogger("pycnid")

# plugin name (as the executable sends it) -> the handler's constructor
PLUGINS: dict[str, Callable[[HandlerDeps], Plugin]] = {
    "ipam": ipam.create,
    "bridge": bridge.create,
    "svc": svc.create,
}


@dataclass(frozen=True)
class Lifecycle:
    """Who this node is, pycnid's metrics registry, and the stops to run at shutdown."""

    node_name: str
    metrics: Registry
    on_shutdown: list[Callable[[], None]] = field(default_factory=list)

    def shut_down(self) -> None:
        """Run every stop, last registered first; one that fails is logged, the rest run."""
        for stop in reversed(self.on_shutdown):
            try:
                stop()
            except Exception:
                log.exception("shutdown hook failed")


@dataclass(frozen=True)
class WiredNode:
    """What ``wire_node`` started: the handlers' ``HandlerDeps`` and the loops behind them."""

    deps: HandlerDeps
    ipam_metrics: IpamMetrics
    housekeeping: Housekeeping
    pool_watch: PoolWatch | None


def wire_node(config: DaemonConfig, life: Lifecycle) -> WiredNode:
    """Open the store and start the node's loops on it (the order is the module's doc)."""
    store = open_store(config.store)
    life.on_shutdown.append(store.close)
    check_store_access(store)
    options = config.ipam
    node = setup_node(life, config, store)  # liveness, reaper; node.store is tracked
    leases = LeaseService(
        node.store, life.node_name, labels=options.labels, block_grace=options.block_grace
    )
    setup_guard(node, life, config, leases)
    serve = bool(config.metrics_address)  # no endpoint: nothing reads them
    ipam_metrics = start_ipam_metrics(life, store, leases, options.metrics_interval, serve=serve)
    housekeeping = Housekeeping(leases, options.housekeeping_interval, life.metrics).start()
    life.on_shutdown.append(housekeeping.stop)
    watch = start_pool_watch(life, store, leases)
    masq = MasqTable(Nft())  # the one writer of the masquerade table: bridge and overlay
    overlay = start_overlay(
        config.overlay,
        config.node.address,
        life.node_name,
        store,
        leases,
        node.liveness,
        life.metrics,
        life.on_shutdown,
        masq,
    )
    source = open_source(config, life.metrics)
    start_proxy(config.proxy, life.node_name, store, life.metrics, life.on_shutdown, source)
    netpol = start_netpol(
        config.netpol,
        life.node_name,
        store,
        life.metrics,
        life.on_shutdown,
        config.node.address,
        source,
    )
    if source is not None and source.reflectors:
        source.start()
        life.on_shutdown.append(source.stop)
        log.info("Kubernetes source: %s from %s", ", ".join(source.status()), source.api.host)
    deps = HandlerDeps(
        life.node_name,
        Faults(config.fault_injection),
        life.metrics,
        store,
        leases,
        node,
        masq,
        overlay=overlay,
        netpol=netpol,
    )
    return WiredNode(deps, ipam_metrics, housekeeping, watch)


def check_store_access(store: Store) -> None:
    """A store that can tell (etcd) says now whether pycnid's credentials are refused; an
    InvalidConfig propagates (a failed start), an unanswered check is only logged."""
    check = getattr(store, "check_access", None)
    if check is None:
        return
    try:
        check()
    except TryAgainLater as exc:
        log.warning("store access not checked at start: %s", exc)


def open_source(config: DaemonConfig, registry: Registry) -> KubeSource | None:
    """The API server as the source of the proxy's and NetworkPolicy's kinds (one client, one
    reflector per kind, shared), when the config has a ``kubernetes`` section and a consumer.
    Started after both consumers asked for their kinds."""
    if config.kube is None or (config.proxy is None and config.netpol is None):
        return None
    from kube.api import open_api

    return KubeSource(open_api(config.kube), config.kube, registry)


def build_plugins(deps: HandlerDeps, life: Lifecycle) -> dict[str, Plugin]:
    """Every handler of ``PLUGINS``, into ``deps.plugins``; each one's close at shutdown."""
    for name, create in PLUGINS.items():
        plugin = create(deps)
        life.on_shutdown.append(plugin.close)
        deps.plugins[name] = plugin
    return deps.plugins


def setup_node(life: Lifecycle, config: DaemonConfig, store: Store) -> NodeContext:
    endpoints = tuple(config.store.endpoints) if config.store.type == "etcd" else ()
    options = config.node
    address = calc_node_address(options.address, endpoints)
    record = NodeRecord(life.node_name, address, options.labels, time.time())
    if config.overlay is not None:  # what the peers hold until the overlay writes it again
        record = with_announced_overlay(store, record)
    liveness = Liveness(store, record, options.heartbeat_ttl).start()
    life.on_shutdown.append(liveness.stop)
    if not supports_leases(store):
        return NodeContext(options, store, store, liveness)
    node = NodeContext(
        options, store, TrackedStore(store), liveness, metrics=reaper_metrics(life.metrics)
    )
    node.reaper = ReaperLoop(
        store,
        life.node_name,
        options.reap_grace,
        options.reap_interval,
        on_pass=node.count,
        registry=life.metrics,
    ).start()
    life.on_shutdown.append(node.reaper.stop)
    return node


def setup_guard(
    node: NodeContext, life: Lifecycle, config: DaemonConfig, leases: LeaseService
) -> None:
    """The outage guard for the lease service (started: it replays a leftover journal)."""
    if not isinstance(node.store, TrackedStore):
        return
    files = OutageFiles(config.state_dir, life.node_name)
    files.tighten()
    node.guard = OutageGuard(
        leases,
        files,
        size=node.options.buffer_size,
        budget=node.options.add_budget,
        metrics=life.metrics,
    )
    node.guard.load().start()
    life.on_shutdown.append(node.guard.stop)

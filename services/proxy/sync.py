"""The Service proxy in pycnid: Service records in, one nftables transaction per change out.

``ProxySync.start()`` returns at once; a loop thread (``common/loop.py``) then, on every pass:

1. reads the prefixes ``view.PREFIXES`` (services, endpoints, pools, service settings, node
   records) and watches each from the revision it read (etcd; SQLite: what changed since);
2. takes the Services the changes touched (``Records.take_dirty``: a Service record, or an
   endpoint its selector picks), builds only their views (``view.calc_service_views``) and
   applies ``ServiceTable.plan`` (``table.py``) through one kept libnftables context: their
   elements diffed against what they had, never a listing of the table, so an update costs
   what it changes. A full render of every Service comes at start, after a refused
   transaction (the table is then unknown) and every ``resyncInterval`` seconds, as four
   transactions (``elements.FullRender``): the skeleton and the affinity chains, begun in a
   child nft while the other Services are planned (``calc_full_plan``), the other
   declarations, every element as one netlink batch (``Nft.run_elements``), the deletes.
   Element changes alone go as one batch too;
   a script of 64 KiB or more (the declarations of thousands of affinity sets, many
   Services' chains at once) runs in a child ``nft -f -`` (``kernel.nft.run_sized``: its
   parse is never pycnid's heap); a small one costs ~0.5 ms in the kept context, ~15 ms in a
   child;
3. deletes stale UDP conntrack entries of the entry points whose serving backends changed
   (``conntrack.py``);
4. hands the healthCheckNodePort servers the targets of the Services it touched and where
   to bind them, and tells them whether the kernel took the pass (``health.py``);
5. publishes the node's addresses and proxy settings it programmed from when they changed
   (``inputs.ProxyInputs``: what `pycni svc trace --node` reads from another node).

A family gets its table once the service settings hold a CIDR of it or a Service has a VIP of
it. Nothing is programmed before the first complete read (an empty view must not reject every
Service). Metrics: sync seconds, Services programmed, refused transactions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from cni.spec.errors import CNIError
from common.collector import freeze_heap, paused_gc
from common.loop import Errors, Loop
from common.metrics import Registry
from kernel.nft import Nft, NftError, Started, run_sized
from kube.source import KubeSource
from services.proxy import conntrack
from services.proxy.config import DEFAULT_PROXY_CONFIG, ProxyConfig
from services.proxy.health import EVERY_ADDRESS, HealthServers, ProxyHealth, calc_health
from services.proxy.inputs import ProxyInputs, read_local_addresses
from services.proxy.kube_source import KINDS as KUBE_KINDS
from services.proxy.kube_source import follow_services
from services.proxy.model import ProxyModel, ServicePortView
from services.proxy.render import FAMILY, TABLE, is_affinity_set, is_shape_chain
from services.proxy.table import Planned, ServiceTable, TablePlan
from services.proxy.view import PREFIXES, Records, calc_changes, calc_node_view
from store.base import Put, Store
from store.keys import ENDPOINTS, SERVICES, proxy_inputs_key
from store.watched import WatchedPrefixes

log = logging.getLogger("pycnid.proxy")
RETRY = 1.0
POLL = 0.5  # a store without watches (SQLite): how often its revision is looked at


class ProxyMetrics:
    def __init__(self, registry: Registry) -> None:
        self.seconds = registry.histogram(
            "pycni_proxy_sync_seconds", "time of one Service proxy sync"
        )
        self.services = registry.gauge(
            "pycni_proxy_services", "Service ports programmed, by family"
        )
        self.failures = registry.counter(
            "pycni_proxy_sync_failures_total", "nftables transactions the kernel refused"
        )
        self.syncs = registry.counter("pycni_proxy_syncs_total", "proxy syncs applied")
        self.stale = registry.counter(
            "pycni_proxy_conntrack_deleted_total", "stale UDP conntrack reply sources deleted"
        )


class ProxySync:
    def __init__(
        self,
        node: str,
        store: Store,
        registry: Registry,
        resync_interval: float,
        config: ProxyConfig = DEFAULT_PROXY_CONFIG,
        kube: KubeSource | None = None,
    ) -> None:
        self.node, self.store, self.resync_interval = node, store, resync_interval
        self.config = config
        self.records = Records()
        self.records.bad.attach(registry)
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.kube = kube
        if kube is not None:
            follow_services(kube, self.records, self.lock, self.wake)
        self.watched = WatchedPrefixes(
            store,
            calc_prefixes(kube is not None),
            self.records,
            self.lock,
            lambda _changed: self.wake.set(),
        )
        self.tables: dict[int, ServiceTable | None] = {4: None, 6: None}
        self.chains: dict[int, set[str] | None] = {4: None, 6: None}  # None: to be listed
        self.hints: dict[int, dict] = {4: {}, 6: {}}  # a dropped table's Services: their order
        self.full_due = 0.0
        self.published: tuple[str, ...] | None = None  # the addresses last published
        self.nft: Nft | None = None
        self.metrics = ProxyMetrics(registry)
        self.proxy_health = ProxyHealth(2 * resync_interval)
        self.health = HealthServers(self.proxy_health)
        self.loop = Loop(
            "proxy-sync",
            self.step,
            retry=RETRY,
            wake=self.wake,
            errors=Errors(log, "proxy sync", expected=(CNIError, NftError)),
            registry=registry,
        )

    def start(self) -> ProxySync:
        self.nft = Nft()  # made here: in the node netns
        self.loop.start()
        return self

    def stop(self) -> None:
        self.loop.stop()
        self.watched.cancel()
        self.health.stop()

    def step(self) -> float:
        self.wake.clear()
        self.watched.ensure()
        if self.kube is not None and not self.kube.synced(KUBE_KINDS):
            return POLL  # nothing programmed before every kind was listed whole
        full = time.monotonic() >= self.full_due
        if full:
            for family in (4, 6):
                self.drop_table(family)
            self.full_due = time.monotonic() + self.resync_interval
        self.sync()
        wait = max(0.0, self.full_due - time.monotonic())
        return wait if self.watched.can_watch else min(wait, POLL)

    def sync(self) -> None:
        """One pass for both families; a family the kernel refused is rendered whole next
        pass, and does not keep the other from its transaction (they share the dirty set)."""
        started = time.perf_counter()
        local = list(read_local_addresses())  # what `pycni svc trace` reads too
        with self.lock:
            unknown = [f for f in (4, 6) if self.tables[f] is None and self.records.wants(f)]
        chains = {f: self.calc_chains(f) for f in unknown}
        with paused_gc():  # at 10k Services the collector's passes over the render's ~10^6
            # new objects (none of them cyclic garbage) took half a full render's time
            with self.lock:
                dirty = self.records.take_dirty()
                health = {k: calc_health(self.records, k, self.node) for k in dirty}
                binds = calc_health_binds(self.records, self.node, local, self.config)
                plans = {
                    f: calc_plan(
                        self.records,
                        self.node,
                        f,
                        local,
                        self.tables[f],
                        dirty,
                        chains.get(f, ()),
                        self.hints[f],
                        self.config,
                        self.nft.start_apart if self.nft is not None else None,
                    )
                    for f in (4, 6)
                }
            planned = time.perf_counter()
            refused = [exc for f, plan in plans.items() if plan and (exc := self.apply(f, plan))]
            full = any(plan and plan.full for plan in plans.values())
            del plans  # a full plan's script and element sets: before the heap is trimmed
            if full and self.nft is not None:
                self.nft.release_cache()
        self.proxy_health.note_pass(not refused)
        self.health.apply(health, binds)
        if not refused:
            self.publish_inputs(tuple(local))
        done = time.perf_counter()
        self.metrics.seconds.observe(done - started)
        (log.info if full else log.debug)(
            "proxy: pass of %d dirty Service(s): %.1f ms (plan %.1f ms)",
            len(dirty),
            (done - started) * 1e3,
            (planned - started) * 1e3,
        )
        if full:
            freeze_heap()
        if refused:
            raise refused[0]

    def publish_inputs(self, local: tuple[str, ...]) -> None:
        """Put this node's inputs when they differ from what it last put; a store error is
        logged and the put retried next pass (the tracer falls back to the node record)."""
        if local == self.published:
            return
        inputs = ProxyInputs(local, self.config, time.time())
        try:
            self.store.txn([], [Put(proxy_inputs_key(self.node), inputs.to_bytes())])
        except CNIError as exc:
            log.warning("proxy: inputs not published (retried next pass): %s", exc.msg)
            return
        self.published = local

    def apply(self, family: int, plan: TablePlan) -> NftError | None:
        """One family's transaction; refused, the table is unknown (None) until re-rendered."""
        if self.nft is None:
            return None
        try:
            run_plan(self.nft, plan)
        except NftError as exc:
            self.drop_table(family)
            self.chains[family] = None
            self.metrics.failures.inc()
            return NftError(f"IPv{family} Service table refused: {exc}")
        table = self.tables[family] or ServiceTable(family)
        table.commit(plan)
        self.tables[family], self.chains[family] = table, table.chains()
        self.hints[family] = {}
        self.metrics.syncs.inc()
        self.metrics.services.set(table.port_count, family=f"ipv{family}")
        self.clean_conntrack(family, plan)
        log.info(
            "proxy: IPv%d table %s, %d Service(s) changed",
            family,
            "rendered" if plan.full else "updated",
            len(plan.services),
        )
        return None

    def drop_table(self, family: int) -> None:
        """The next pass renders the family whole; the table's Services stay as hints, so a
        resync keeps affinity ports' endpoint order."""
        table = self.tables[family]
        if table is not None:
            self.hints[family] = table.services
        self.tables[family] = None

    def calc_chains(self, family: int) -> set[str]:
        """The shape chains (and an earlier layout's ``clients-`` sets) the kernel holds: known
        from the last commit, else listed (at start and after a refused transaction): terse,
        names only; a listing with the elements kept ~100 MiB in the context at 10k Services."""
        known = self.chains[family]
        if known is not None or self.nft is None:
            return known or set()
        found = set()
        for kind, owned in (("chain", is_shape_chain), ("set", is_affinity_set)):
            doc = self.nft.list_json(f"list {kind}s {FAMILY[family]}", terse=True)
            found |= {
                o[kind]["name"]
                for o in doc.get("nftables", [])
                if kind in o and o[kind].get("table") == TABLE and owned(o[kind]["name"])
            }
        return found

    def clean_conntrack(self, family: int, plan: TablePlan) -> None:
        """UDP entries of the changed Services whose answer comes from a non-serving source."""
        before = ProxyModel(family, plan.node, tuple(v for vs in plan.before.values() for v in vs))
        after = ProxyModel(
            family, plan.node, tuple(v for p in plan.services.values() for v in p.views)
        )
        checks = conntrack.calc_checks(
            conntrack.calc_udp_serving(before), conntrack.calc_udp_serving(after), plan.full
        )
        self.metrics.stale.inc(conntrack.clean_stale(checks, family))


def calc_prefixes(from_kube: bool) -> tuple[str, ...]:
    """The store prefixes the proxy reads: all of ``PREFIXES``, or, when Services and their
    endpoints come from the API server, the rest (pools, service settings, nodes)."""
    return tuple(p for p in PREFIXES if not from_kube or p not in (SERVICES, ENDPOINTS))


def run_plan(nft: Nft, plan: TablePlan) -> None:
    """A plan's transactions: a full render's three steps (its elements as one netlink
    batch, made and encoded while nft applies the declarations, the commit's counts made
    while the kernel takes the batch); an update of elements alone as one netlink batch
    (libnftables would first re-read every set declaration: ~5 ms beside 2,500 affinity
    sets); any other script."""
    if plan.steps is not None:
        steps = plan.steps
        if plan.started is not None:
            plan.started.wait()
        nft.run_then_elements(
            steps.declarations, lambda: steps.elements, beside=lambda: plan.tally
        )
        run_sized(nft, steps.deletes)
    elif plan.elements is not None:
        nft.run_elements(plan.elements)
    else:
        run_sized(nft, plan.text)


def calc_health_binds(
    records: Records, node: str, local: list[str], config: ProxyConfig
) -> tuple[str, ...]:
    """Where healthCheckNodePorts listen: every address, or, under ``nodePortAddresses``,
    the node's NodePort addresses of both families (kube-proxy binds them there)."""
    if config.node_port_cidrs is None and not config.node_port_primary:
        return EVERY_ADDRESS
    views = (calc_node_view(records, node, family, local, config) for family in (4, 6))
    return tuple(str(ip) for view in views for ip in view.node_ips)


def calc_full_plan(
    records: Records,
    node: str,
    family: int,
    local: list[str],
    chains: Iterable[str],
    hints: Mapping[str, Planned] | None,
    config: ProxyConfig,
    early: Callable[[str], Started] | None,
) -> TablePlan:
    """Every Service rendered whole; with ``early``, the Services under affinity viewed and
    planned first and their chains sent (``ServiceTable.send_early``) before the others are
    viewed, the rest of the plan then made while nft parses them."""
    table, keys, sent = ServiceTable(family), list(records.services), None
    first: dict[str, tuple[ServicePortView, ...]] = {}
    if early is not None:
        affine = [k for k in keys if records.services[k].session_affinity == "ClientIP"]
        view, first = calc_changes(records, node, family, local, affine, config)
        sent = table.send_early(view, first, hints or {}, early)
    rest = [k for k in keys if k not in first]
    view, changes = calc_changes(records, node, family, local, rest, config)
    changes = {k: first[k] if k in first else changes[k] for k in keys}
    return table.plan(view, changes, True, chains, hints, sent)


def calc_plan(
    records: Records,
    node: str,
    family: int,
    local: list[str],
    table: ServiceTable | None,
    dirty: set[str],
    chains: Iterable[str] = (),
    hints: Mapping[str, Planned] | None = None,
    config: ProxyConfig = DEFAULT_PROXY_CONFIG,
    early: Callable[[str], Started] | None = None,
) -> TablePlan | None:
    """A pass's transaction for one family (None: nothing to do): the dirty Services against
    the table, or every Service rendered whole when there is none. A family's table is made
    once a service CIDR or a ClusterIP of it exists (``Records.wants``: until then a pass
    builds no view for it, which at 10k Services had cost every pass 0.25 s); a full render
    deletes the shape ``chains`` the kernel holds that it does not need, and with ``early``
    (``Nft.start_apart``) sends its skeleton and affinity chains before it plans the other
    Services: nft's parse of them (~0.3 s at 10k Services) then runs beside that plan."""
    if table is None and not records.wants(family):
        return None
    if table is None:
        return calc_full_plan(records, node, family, local, chains, hints, config, early)
    view, changes = calc_changes(records, node, family, local, dirty | table.left_out, config)
    if not changes and view == table.node:
        return None
    return table.plan(view, changes)

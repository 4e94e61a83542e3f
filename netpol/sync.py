"""NetworkPolicy enforcement in pycnid: the store's records in, ``table inet pycni-netpol`` out.

``NetpolSync.start()`` returns at once; a loop thread (``common/loop.py``) then, on every pass,
reads the prefixes ``view.PREFIXES`` (policies, namespaces, endpoints, node records) and
watches them from the revision read (etcd; SQLite is asked what changed when its revision
moved, ``store/watched.py``), and when anything changed (a record, this node's addresses)
renders the node's layout (``render.calc_layout``, from what the last render kept:
``render.LayoutCache``) and sends the kernel what differs from the layout it committed last
(``diff.render_diff``): one transaction that flushes nothing but the chains whose rules
changed, so a Pod's relabel costs its elements, not the table's. A diff of set and map elements
alone goes as one netlink batch (``Nft.run_elements``, as the Service proxy's updates:
libnftables would first re-read the table's declarations and interval elements), any other
through the kept libnftables context, a large one in a child nft (``kernel.nft.run_sized``).
The table is rendered whole (``render.render_full``: flushed and refilled in one transaction
that never deletes it) at start, every ``resyncInterval`` seconds (its layout then computed
from nothing, not from what the last render kept), and after the kernel refused
a transaction (the committed layout is then dropped: a refused diff is logged, counted and
followed by a full render in the same pass). Either way a packet meets the old rules or the new
ones, never an empty table. Into a kernel whose table holds nothing (a node's first start), the
plain sets' and maps' elements follow the script as one netlink batch
(``diff.calc_first_render``): nothing was isolated before it, and the batch isolates every Pod
at once. A pass that changes nothing sends nothing. Nothing is programmed before the first
complete read.

The objects a render made are remembered, so a full render deletes those it no longer needs;
at start, and after a refused transaction, they are listed from the kernel (names only).

Same-node traffic between Pods of one bridge reaches the inet forward hook only when bridged
IPv4/IPv6 frames are passed to it (br_netfilter, ``net.bridge.bridge-nf-call-iptables`` and
``-ip6tables`` = 1 in the node's netns). ``check_bridge_filtering`` reads both at start; one
that is not 1 is logged as an error naming it and exported as
``pycni_netpol_bridge_filtering{sysctl} 0``: Pods of this node then reach each other
whatever the policies. pycnid never writes them (they are the machine's).

With pycnid's ``kubernetes`` section the policies, Namespaces and Pods come from the API
server (``netpol/from_kube.py``; the store gives the node records only), and nothing is
programmed before the three kinds were listed whole.

A new Pod is isolated before its ADD returns. In store mode pycni-svc's ADD hands over its
endpoint record (``settle``); when the kernel already holds the chain of the Pod's policies
(another Pod of the node with the same ones), its map entries are added at once as one netlink
batch and the ADD returns (``isolate.py``: pinned until a pass that read them commits). Under
the Kubernetes source the API learns a Pod's addresses only when kubelet writes them, after
the ADD; so pycni-bridge's ADD hands over the Pod it attaches and the addresses it assigned
(``settle_attached``), laid over the Pod object (``netpol/attached.py``) until DEL
``detach``es them; at start they are taken back from pycni-ipam's handles of this node.
Otherwise the ADD returns once a pass that began after the call ended well (``wait_pass``;
``passed`` is called as soon as the kernel holds the render), else TryAgainLater within
``SETTLE`` seconds.

After an ADD isolated its Pod at once, the pass that adds the rest (the Pod as a peer, its
counter) is put off by ``AFTER_ADD``: begun at once, it read the store while the ADD was
finishing and answering, and the two took turns on the interpreter (pycni-svc's ADD served
in 3.3 ms instead of 1.0 ms). A pass an ADD waits for is never put off.

A pass runs with the cyclic collector paused (``common/collector.py``); once its ADDs were
released, a whole render's heap is frozen after one collection and a diff's new objects
without one (``settle_heap``). The young collections a diff's pause deferred otherwise walked
its layout in the next request's handler (1-2 ms each in ADD and DEL handlers at 10k Pods).

Existing connections are kept (conntrack accepts them before any rule); with ``purge``
(``existingConnections``), those the model now denies are deleted after each render the
kernel took (``purge.py``).

Metrics: ``pycni_netpol_sync_seconds``, ``_syncs_total``, ``_sync_failures_total``,
``_conntrack_purged_total``, ``_settled_at_once_total``,
``_isolated_pods{direction}``, ``_active_policies``, ``_dropped_packets{direction}`` (the
per-Pod drop counters of the table, read every ``COUNTERS`` seconds and within
``COUNTERS_AFTER`` of a pass that changed the table, on a thread of their own, as one netlink
dump of the table's counters (``Nft.counters``): ``nft -j list counters`` read every
declaration first, 130-170 ms of CPU at 1,000 policies for ~20 counters, up to once a second
on a node whose Pods come and go).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from cni.spec.errors import CNIError, TryAgainLater
from common.collector import freeze_heap, freeze_young, paused_gc
from common.loop import Errors, Loop
from common.metrics import Registry
from kernel.nft import Nft, NftError, run_sized, table_exists
from kernel.nftelem import ElementBatch
from kernel.sysctl import read_sysctl
from kube.source import KubeSource
from netpol.attached import AttachedPod, read_attached
from netpol.config import DEFAULT_NETPOL_RESYNC
from netpol.diff import NotDiffable, calc_element_batch, calc_first_render, render_diff
from netpol.evaluate import PodInfo, PolicyInputs
from netpol.from_kube import PolicyObjects
from netpol.isolate import Pin, calc_pins, with_pins
from netpol.policy import NetworkPolicy
from netpol.purge import purge_denied
from netpol.render import TABLE, Layout, LayoutCache, Object, calc_layout, render_full
from netpol.view import PREFIXES, Records
from services.proxy.inputs import read_local_addresses
from store.base import KV, Store
from store.keys import NODES
from store.watched import WatchedPrefixes

log = logging.getLogger("pycnid.netpol")
RETRY = 1.0
POLL = 0.5  # a store without watches (SQLite): how often its revision is looked at
SETTLE = 5.0  # seconds an ADD waits for the pass that isolates its Pod
COUNTERS = 10.0  # seconds between reads of the drop counters when nothing changes
COUNTERS_AFTER = 1.0  # seconds from a pass that changed the table to the next read, at most
LOCAL_ADDRESSES = 1.0  # seconds a read of the netns' own addresses is used for
AFTER_ADD = 0.005  # seconds a pass waits after an ADD that isolated its Pod at once
BRIDGE_SYSCTLS = ("net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables")
KINDS = ("chain", "set", "map", "counter")


class NetpolMetrics:
    def __init__(self, registry: Registry) -> None:
        self.seconds = registry.histogram(
            "pycni_netpol_sync_seconds", "time of one NetworkPolicy sync (render + apply)"
        )
        self.syncs = registry.counter("pycni_netpol_syncs_total", "NetworkPolicy renders applied")
        self.failures = registry.counter(
            "pycni_netpol_sync_failures_total", "NetworkPolicy transactions the kernel refused"
        )
        self.isolated = registry.gauge(
            "pycni_netpol_isolated_pods", "local Pods isolated, by direction"
        )
        self.policies = registry.gauge("pycni_netpol_active_policies", "policies in the store")
        self.dropped = registry.gauge(
            "pycni_netpol_dropped_packets",
            "packets dropped by policy, the local Pods' counters summed, by direction",
        )
        self.purged = registry.counter(
            "pycni_netpol_conntrack_purged_total",
            "established connections deleted because the policies now deny them (purge)",
        )
        self.at_once = registry.counter(
            "pycni_netpol_settled_at_once_total",
            "ADDs that isolated their Pod with its own map entries (or found nothing to "
            "isolate) without waiting for a pass",
        )
        self.bridge = registry.gauge(
            "pycni_netpol_bridge_filtering",
            "1 when bridged frames reach the inet forward hook (the sysctl is 1), else 0",
        )


class NetpolSync:
    def __init__(
        self,
        node: str,
        store: Store,
        registry: Registry,
        resync_interval: float = DEFAULT_NETPOL_RESYNC,
        node_address: str | None = None,
        local_addresses: Callable[[], tuple[str, ...]] = read_local_addresses,
        purge: bool = False,
        kube: KubeSource | None = None,
    ) -> None:
        self.purge = purge
        self.to_purge: PolicyInputs | None = None  # what the next purge judges by
        self.node, self.store, self.resync_interval = node, store, resync_interval
        self.node_address = node_address
        self.local_addresses = local_addresses
        self.local: tuple[str, ...] = ()
        self.local_due = 0.0  # when the netns' own addresses are read again; 0: by a pass
        self.records = Records()
        self.records.bad.attach(registry)
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.kube = PolicyObjects(kube, self.wake.set) if kube is not None else None
        self.watched = WatchedPrefixes(
            store,
            (NODES,) if kube is not None else PREFIXES,  # the rest from the API server
            self.records,
            self.lock,
            lambda _changed: self.note_change(),
        )
        self.changed_at: float | None = None  # the first store change the next pass reads
        self.nft: Nft | None = None
        self.objects: frozenset[Object] | None = None  # None: to be listed from the kernel
        self.layout: Layout | None = None  # what the kernel holds; None: render it whole
        self.kernel = threading.Lock()  # the layout the kernel holds, and sending to it
        self.pins: list[tuple[int, Pin]] = []  # (generation, element) added by ``settle``
        self.generation = 0  # of the records: bumped by each ``settle``
        self.cache = LayoutCache()  # what a render keeps for the next
        self.full_due = 0.0
        self.counters_due = 0.0
        self.metrics = NetpolMetrics(registry)
        self.passes = threading.Condition()
        self.started = 0  # passes begun
        self.running = 0  # the pass under way (or the last one)
        self.ok_through = 0  # the last pass that ended with the kernel holding its render
        self.put_off: float | None = None  # no pass begins before then (``AFTER_ADD``)
        self.loop = Loop(
            "netpol-sync",
            self.step,
            retry=RETRY,
            wake=self.wake,
            errors=Errors(log, "netpol sync", expected=(CNIError, NftError)),
            registry=registry,
        )
        self.counters_wake = threading.Event()  # counters_due moved nearer
        self.counters_loop = Loop(
            "netpol-counters",
            self.step_counters,
            retry=COUNTERS,
            wake=self.counters_wake,
            errors=Errors(log, "netpol drop counters", expected=(NftError,)),
            registry=registry,
        )

    def start(self) -> NetpolSync:
        self.nft = Nft()  # made here: in the node netns
        check_bridge_filtering(self.metrics)
        if self.kube is not None:
            self.take_back_attachments()
        self.loop.start()
        self.counters_loop.start()
        return self

    def take_back_attachments(self) -> None:
        """The attachments of this node's Pods, from pycni-ipam's handles (a pycnid started
        again: kubelet may not have written their addresses yet)."""
        assert self.kube is not None
        try:
            found = read_attached(self.store, self.node)
        except CNIError as exc:  # the store did not answer: only that window stays open
            log.warning("netpol: this node's attachments not taken back: %s", exc)
            return
        self.kube.attach_all(found)
        log.info("netpol: %d attachment(s) of this node taken back", len(found))

    def stop(self) -> None:
        self.loop.stop()
        self.counters_loop.stop()
        self.watched.cancel()

    def settle(self, key: str, value: bytes, timeout: float = SETTLE) -> None:
        """Return once the kernel holds a render that knows the endpoint record ``key``
        (pycni-svc's ADD calls this after writing it, so a new Pod is isolated before its
        containers start): the record goes into the view at once (an etcd watch may bring
        it later), then a pass that began after this call must end well.
        TryAgainLater when it does not within ``timeout`` (the kernel refused, or pycnid is
        overloaded): the ADD fails and the runtime tries again. With the Kubernetes source the
        endpoint record is not an input (the Pod object is): ``settle_attached`` is the wait."""
        if self.kube is not None:
            return
        with self.lock:
            self.records.apply(KV(key, value, 0))
            pod = self.records.pod_of(key)
            isolating = self.records.isolating(pod) if pod is not None else {}
            self.generation += 1
            generation = self.generation
        if pod is not None and self.isolate_now(pod, isolating, generation):
            self.put_off_pass()  # the pass adds the rest: counters, peer sets
            return
        self.wait_pass(timeout, f"the Pod of {key}")

    def isolate_now(
        self, pod: PodInfo, isolating: dict[str, list[NetworkPolicy]], generation: int
    ) -> bool:
        """Isolate ``pod`` with its map entries alone, against the layout the kernel holds
        (``isolate.py``); False when that is not possible (no complete pass yet, a chain the
        kernel lacks, the kernel refused): the ADD then waits for a pass."""
        with self.kernel:
            held = self.layout
            if held is None or self.nft is None:
                return False
            pins = calc_pins(held, pod, isolating)
            layout = with_pins(held, pins) if pins is not None else None
            if pins is None or layout is None:
                return False
            batch = calc_element_batch(held, layout)
            if batch is None and layout.sets != held.sets:
                return False  # not a batch the encoder takes: a pass renders it
            try:
                if batch is not None:
                    self.nft.run_elements(batch)
            except NftError as exc:
                log.warning("netpol: Pod %s not isolated at once: %s", pod.ref, exc)
                return False
            self.layout = layout
            self.pins += [(generation, pin) for pin in pins]
        self.metrics.at_once.inc()
        return True

    def settle_attached(self, key: str, pod: AttachedPod, timeout: float = SETTLE) -> None:
        """With the Kubernetes source: return once the kernel holds a render that knows the
        attachment ``key`` of ``pod`` with the addresses its ADD assigned (pycni-bridge's
        ADD calls this, before kubelet writes them into the Pod's status). It waits for the
        Pod object first (labels, node and ports are the API's), then for a pass that began
        after the attachment was laid over it (``netpol/attached.py``). TryAgainLater naming
        the Pod when either does not come within ``timeout``; the attachment is then
        forgotten. Without the Kubernetes source the endpoint record is the input: nothing."""
        if self.kube is None:
            return
        deadline = time.monotonic() + timeout
        if not self.kube.wait_pod(pod, timeout):
            raise TryAgainLater(
                f"NetworkPolicy: Pod {pod.ref} is not known to the API server yet",
                f"no Pod object {pod.ref}{f' (uid {pod.uid})' if pod.uid else ''} "
                f"read from the API server within {timeout:g}s",
            )
        self.kube.attach(key, pod)
        try:
            self.wait_pass(deadline - time.monotonic(), f"Pod {pod.ref}")
        except TryAgainLater:
            self.detach(key)
            raise

    def detach(self, key: str) -> None:
        """Forget the attachment ``key`` (DEL, or an ADD rolled back); the next pass, woken
        here, takes its addresses out. Never fails; nothing known is success."""
        if self.kube is not None:
            self.kube.detach(key)

    def wait_pass(self, timeout: float, what: str) -> None:
        """Return once a pass that began after this call ended well; TryAgainLater naming
        ``what`` when none did within ``timeout``."""
        with self.passes:
            target = self.started + 1
            self.put_off = None
            self.wake.set()
            if not self.passes.wait_for(lambda: self.ok_through >= target, max(timeout, 0.0)):
                raise TryAgainLater(
                    f"NetworkPolicy: {what} is not programmed yet",
                    f"no NetworkPolicy pass ended well within {timeout:g}s",
                )

    def put_off_pass(self) -> None:
        """A pass soon, once the ADD that asks for it has answered (``AFTER_ADD``); a pass
        already put off is not put off further."""
        with self.passes:
            if self.put_off is None:
                self.put_off = time.monotonic() + AFTER_ADD
        self.wake.set()

    def step(self) -> float:
        with self.passes:
            if self.put_off is not None:
                left = self.put_off - time.monotonic()
                if left > 0:
                    return left  # not a pass: ``started`` stays for ``wait_pass``
                self.put_off = None
            self.started += 1
            self.running = self.started
        try:
            wait = self._step()
        except PinsAhead:
            self.wake.set()  # read the inputs again at once; this pass did not end well
            return 0.0
        self.passed()
        return wait

    def passed(self) -> None:
        """The running pass ended well: the ADDs waiting for it (``wait_pass``) may return.
        Called as soon as the kernel holds its render, before the counters are read."""
        with self.passes:
            self.ok_through = self.running
            self.passes.notify_all()

    def _step(self) -> float:
        self.wake.clear()
        self.watched.ensure()
        if self.kube is not None and not self.kube.synced():
            return POLL  # nothing programmed before the three kinds were listed whole
        now = time.monotonic()
        if now >= self.full_due:
            with self.kernel:
                self.layout = None  # a resync: rendered whole even if unchanged
            self.cache = LayoutCache()  # and computed from nothing, as at start
            self.local_due = 0.0  # and the netns' addresses read again
            self.full_due = now + self.resync_interval
        how = self.sync()
        self.passed()
        self.settle_heap(how)
        self.run_purge()
        wait = max(0.0, self.full_due - time.monotonic())
        return wait if self.watched.can_watch else min(wait, POLL)

    def step_counters(self) -> float:
        """The drop counters' own loop: a listing (~200 ms at 1,000 policies) on the pass's
        thread held up the next pass, so a policy change that came during it. It also reads
        the netns' own addresses every ``LOCAL_ADDRESSES`` seconds, off the pass's path."""
        now = time.monotonic()
        if now >= self.counters_due:
            self.read_counters()
        if self.local_due and now >= self.local_due:
            self.refresh_local_addresses()
        due = min(self.counters_due, self.local_due or self.counters_due)
        return max(0.0, due - time.monotonic())

    def refresh_local_addresses(self) -> None:
        """Read the netns' own addresses again; a pass is woken when they changed."""
        found = self.local_addresses()
        self.local_due = time.monotonic() + LOCAL_ADDRESSES
        if found != self.local:
            self.local = found
            self.wake.set()

    def note_change(self) -> None:
        """A store change came (the watch's thread): wake the loop, and keep when it came."""
        if self.changed_at is None:
            self.changed_at = time.perf_counter()
        self.wake.set()

    def sync(self) -> str | None:
        """Render the table; apply what differs from what the kernel holds: the diff from the
        committed layout ('updated'), or the table whole when there is none ('rendered');
        None when there was nothing to send."""
        started = time.perf_counter()
        changed_at, self.changed_at = self.changed_at, None
        with paused_gc():  # the collections a pass makes due run after it, as the proxy's:
            # a probe at 10k Pods met a full one of 64 ms and others of up to 4 ms in passes
            addresses = self.calc_node_addresses()
            with self.lock:
                inputs = self.records.inputs()
                generation = self.generation
            if self.kube is not None:
                inputs = self.kube.inputs(inputs.node_ips)
            layout = calc_layout(inputs, self.node, addresses, self.cache)
            with self.kernel:
                how = self.apply_layout(self.with_later_pins(layout, generation))
                self.pins = [(g, pin) for g, pin in self.pins if g > generation]
        if how is None:
            return None
        if self.purge:  # run once the pass's waiting ADDs were released (``_step``)
            node_ips = {**inputs.node_ips, self.node: addresses}  # the kernel exempts these
            self.to_purge = replace(inputs, node_ips=node_ips)
        self.metrics.seconds.observe(time.perf_counter() - started)
        self.metrics.policies.set(len(inputs.policies))
        for direction, count in layout.isolated.items():
            self.metrics.isolated.set(count, direction=direction.lower())
        log.info(
            "netpol: table %s: %d policies, %d/%d local Pods isolated (in/eg), %.1f ms%s",
            how,
            len(inputs.policies),
            layout.isolated["Ingress"],
            layout.isolated["Egress"],
            (time.perf_counter() - started) * 1e3,
            ""
            if changed_at is None  # a resync, an ADD's wake: no store change to time from
            else f" (begun {(started - changed_at) * 1e3:.1f} ms after the store change it read)",
        )
        self.counters_due = min(self.counters_due, time.monotonic() + COUNTERS_AFTER)
        self.counters_wake.set()
        return how

    def settle_heap(self, how: str | None) -> None:
        """After a pass the kernel took as ``how`` (``sync``'s answer), once its waiting
        ADDs were released (``passed``): a whole render's garbage goes back to the system and
        what is alive (the Pods, policies and layout) is frozen after one collection
        (``freeze_heap``, ~75 ms at 10k Pods); a diff's new objects are frozen without one
        (``freeze_young``)."""
        if how == "rendered":
            if self.nft is not None:
                # a whole render's script and sets are garbage now: libnftables' cache of
                # them and the freed heap go back to the system, as after the proxy's
                self.nft.release_cache()
            freeze_heap()
        elif how is not None:
            freeze_young()

    def with_later_pins(self, layout: Layout, generation: int) -> Layout:
        """``layout`` (from inputs read at ``generation``) with the entries ``settle`` pinned
        since: the Pods they isolate are not in its inputs, and must stay isolated.
        PinsAhead when one names a chain this layout no longer has."""
        later = [pin for g, pin in self.pins if g > generation]
        if not later:
            return layout
        merged = with_pins(layout, later)
        if merged is None:
            raise PinsAhead(f"{len(later)} pinned element(s) name what this layout lacks")
        return merged

    def run_purge(self) -> None:
        """The conntrack entries the inputs of the last applied pass deny (``purge.py``)."""
        inputs, self.to_purge = self.to_purge, None
        if inputs is not None:
            self.metrics.purged.inc(purge_denied(inputs, self.node))

    def apply_layout(self, layout: Layout) -> str | None:
        """Bring the kernel to ``layout``: 'updated' (a diff), 'rendered' (whole), None
        (nothing differed). A refused diff is logged and counted, and the table rendered whole
        in the same pass (the layout the kernel holds is then listed again)."""
        if self.layout is not None:
            try:
                batch = calc_element_batch(self.layout, layout)  # no script needed then
                script = "" if batch is not None else render_diff(self.layout, layout)
                if batch is None and not script:
                    return None
                self.apply(layout, lambda nft: send_update(nft, script, batch))
                return "updated"
            except NotDiffable as exc:
                log.info("netpol: rendering the table whole: %s", exc)
            except NftError as exc:
                log.warning("netpol: update refused, rendering the table whole: %s", exc)
        known = self.known_objects()
        if not known:  # the kernel isolates nothing yet: the elements may follow as a batch
            script, batch = calc_first_render(layout)
            self.apply(layout, lambda nft: send_first(nft, script, batch))
            return "rendered"
        script = render_full(layout, known - layout.objects)
        self.apply(layout, lambda nft: run_sized(nft, script))
        return "rendered"

    def calc_node_addresses(self) -> tuple[str, ...]:
        """This node's addresses: its record's (or the configured one) and the netns' own."""
        with self.lock:
            record = next((r for r in self.records.nodes.values() if r.name == self.node), None)
        found = [a for a in (self.node_address, record and record.address) if a]
        return tuple(dict.fromkeys([*found, *self.read_local_addresses()]))

    def read_local_addresses(self) -> tuple[str, ...]:
        """The netns' own addresses: read here at the first pass and at every resync, else
        as the counters' loop last read them (``refresh_local_addresses``, every
        ``LOCAL_ADDRESSES`` seconds): the netlink dump, 0.5-1.5 ms, was in every pass that
        came a second after the last read, so in most policy or label changes."""
        if not self.local_due:
            self.local = self.local_addresses()
            self.local_due = time.monotonic() + LOCAL_ADDRESSES
            self.counters_wake.set()  # its loop takes the reading over from now
        return self.local

    def apply(self, layout: Layout, send: Callable[[Nft], None]) -> None:
        """One transaction; refused, what the kernel holds is unknown: the next render is
        whole, its stale objects listed."""
        if self.nft is None:
            return
        try:
            send(self.nft)
        except NftError as exc:
            self.objects, self.layout = None, None
            self.metrics.failures.inc()
            raise NftError(f"NetworkPolicy table refused: {exc}") from None
        self.objects, self.layout = layout.objects, layout
        self.metrics.syncs.inc()

    def known_objects(self) -> frozenset[Object]:
        """What the table holds: known from the last commit, else listed (names only)."""
        if self.objects is not None or self.nft is None:
            return self.objects or frozenset()
        if not table_exists(self.nft, "inet", TABLE):
            return frozenset()
        doc = self.nft.list_json(f"list table inet {TABLE}", terse=True)
        found = {
            (kind, o[kind]["name"])
            for o in doc.get("nftables", [])
            for kind in KINDS
            if kind in o and o[kind].get("table") == TABLE
        }
        self.objects = frozenset(found)
        return self.objects

    def read_counters(self) -> None:
        """The drop counters, summed by direction (``dropped-in/…``, ``dropped-eg/…``)."""
        self.counters_due = time.monotonic() + COUNTERS
        if self.nft is None or self.layout is None:
            return
        sums = {"ingress": 0, "egress": 0}
        for name, (packets, _bytes) in self.nft.counters("inet", TABLE).items():
            if name.startswith(("dropped-in/", "dropped-eg/")):
                sums["ingress" if name.startswith("dropped-in/") else "egress"] += packets
        for direction, packets in sums.items():
            self.metrics.dropped.set(packets, direction=direction)


class PinsAhead(Exception):
    """A pass's layout cannot carry what ``settle`` pinned since its inputs were read: it is
    not sent, and the next pass reads the inputs again (they hold those Pods then)."""


def send_first(nft: Nft, script: str, batch: ElementBatch | None) -> None:
    """A first render (``diff.calc_first_render``): its script, then its elements' batch
    (encoded while nft applies the script)."""
    if batch is not None:
        nft.run_then_elements(script, lambda: batch)
    else:
        run_sized(nft, script)


def send_update(nft: Nft, script: str, batch: ElementBatch | None) -> None:
    """A diff: as a netlink batch when it is one (``diff.calc_element_batch``: the same
    transaction without libnftables' re-read of every set's elements), else its script."""
    if batch is not None:
        nft.run_elements(batch)
    else:
        run_sized(nft, script)


def check_bridge_filtering(
    metrics: NetpolMetrics | None = None, read: Callable[[str], str | None] = read_sysctl
) -> list[str]:
    """The br_netfilter sysctls of this netns that keep bridged frames from the inet
    forward hook (absent: the module is not loaded; or not 1), each logged as an error."""
    off = []
    for name in BRIDGE_SYSCTLS:
        value = read(name)
        ok = value is not None and value.strip() == "1"
        if metrics is not None:
            metrics.bridge.set(1 if ok else 0, sysctl=name)
        if not ok:
            off.append(name)
            log.error(
                "netpol: %s is %s: Pods on one bridge reach each other without NetworkPolicy "
                "(load br_netfilter and set it to 1 in the node's netns)",
                name,
                "absent" if value is None else value.strip(),
            )
    return off

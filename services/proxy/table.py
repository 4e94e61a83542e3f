"""What one family's Service table holds, per Service, and the transaction to its next state.

The proxy's sync cost must follow what changed, not how many Services exist (``make bench-svc``'s
goal: a one-Service update at 10k Services within 5 ms). So pycnid keeps, per Service, the port
views it programmed and the elements and shapes they produced, with a count per element and per
shape (a hairpin element or a shared ``lb-N`` chain serves several Services). A sync hands
over only the Services that changed; their elements are diffed against what they had, and an
element or shape goes when its last user does. The table is never listed (knftables style):
this memory is the only copy of what was committed.

``plan`` is pure with respect to the table: the caller runs the plan (services/proxy/sync.py
``run_plan``) and, when the kernel took it, ``commit(plan)``. A refused transaction leaves
the table unknown: the caller drops it and the next sync renders the family whole
(``plan(..., full=True)``).
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import NamedTuple

from kernel.nft import Started
from kernel.nftelem import ElementBatch
from services.proxy.elements import (
    FullRender,
    calc_early_declarations,
    calc_element_batch,
    calc_full_render,
    calc_node_elements,
    calc_service_parts,
    render_elements,
)
from services.proxy.model import Backend, NodeView, ProxyModel, ServicePortView
from services.proxy.render import (
    FAMILY,
    STICKY_MAPS,
    TABLE,
    AnyShape,
    Element,
    calc_index_objects,
    calc_shape_chains,
    is_affinity_set,
    render_shape,
)

log = logging.getLogger("pycnid.proxy")
Views = tuple[ServicePortView, ...]


@dataclass(frozen=True)
class Planned:
    """A Service's new state in a plan: its views, elements and shapes (empty: gone); each
    once, held as tuples (a table keeps one per Service: a frozenset of 7 elements is 728
    bytes, their tuple 96)."""

    views: Views
    elements: tuple[Element, ...]
    shapes: tuple[AnyShape, ...]
    left_out: bool = False  # its entries are another Service's


@dataclass
class TablePlan:
    """One transaction (a full render: three, ``steps``) and what the table holds once the
    kernel took it."""

    text: str  # an update's script ("" for a full render: its ``steps``)
    full: bool
    node: NodeView
    node_elements: frozenset[Element]
    services: dict[str, Planned]
    before: dict[str, Views]  # the changed Services' views before (for conntrack)
    owners: dict[tuple[str, str], str] = field(default_factory=dict)  # full plans: all
    # an update that changes elements only: the same transaction as one netlink batch
    # (kernel/nftelem.py), which spares libnftables' cache refill; None: run the script
    elements: ElementBatch | None = None
    steps: FullRender | None = None  # a full render's transactions
    started: Started | None = None  # its early declarations, when they were sent

    @property
    def script(self) -> str:
        """The whole change as one nft script (a full render's steps joined: tests, golden
        files, benches; pycnid runs the steps)."""
        return self.steps.render() if self.steps is not None else self.text

    @functools.cached_property
    def tally(self) -> Tally:
        """A full plan's counts as the table will hold them once committed (counted in C:
        per-Service deltas were a tenth of a 10k render); made on first use, which
        ``sync.run_plan`` makes while the kernel takes the element batch."""
        planned = [p for p in self.services.values() if p.views]
        elements = Counter(chain.from_iterable(p.elements for p in planned))
        elements.update(self.node_elements)
        shapes = Counter(chain.from_iterable(p.shapes for p in planned))
        names = Counter(shape.chain for shape in shapes)
        return Tally(elements, shapes, names, sum(len(p.views) for p in planned))


class EarlyRender(NamedTuple):
    """A full render's first step (``ServiceTable.send_early``): the transaction begun, its
    script, the shapes it declared, and its Services' plans."""

    started: Started
    script: str
    declared: frozenset[AnyShape]
    planned: dict[str, Planned]


class Tally(NamedTuple):
    elements: Counter
    shapes: Counter
    names: Counter
    ports: int


@dataclass
class ServiceTable:
    """The committed state of ``family``'s table (empty until a full plan is committed)."""

    family: int
    node: NodeView | None = None
    node_elements: frozenset[Element] = frozenset()
    services: dict[str, Planned] = field(default_factory=dict)
    element_counts: Counter = field(default_factory=Counter)
    shape_counts: Counter = field(default_factory=Counter)
    name_users: Counter = field(default_factory=Counter)  # chain name -> live shapes
    port_count: int = 0  # port views programmed (the proxy's metric)
    owners: dict[tuple[str, str], str] = field(default_factory=dict)  # entry -> Service
    left_out: set[str] = field(default_factory=set)  # retried every pass (calc_plan)

    def plan(
        self,
        node: NodeView,
        changes: Mapping[str, Views],
        full: bool = False,
        chains: Iterable[str] = (),
        hints: Mapping[str, Planned] | None = None,
        early: EarlyRender | None = None,
    ) -> TablePlan:
        """The transaction that gives the Services in ``changes`` their views (``()``: the
        Service is gone). A changed node view re-plans every Service (NodePort addresses);
        ``full`` starts from an empty table and renders the whole family, deleting the shape
        ``chains`` the kernel holds that it no longer needs (a restart's leftovers), and an
        earlier layout's per-endpoint ``clients-`` sets; ``hints``
        (the table it replaces) keeps affinity ports' endpoint order; ``early``: what
        ``send_early`` sent of a full render (its Services are not planned again; the caller
        waits for it before the rest: ``sync.run_plan``)."""
        if full:
            return self._plan_full(node, changes, set(chains), hints or {}, early)
        if node != self.node:
            changes = {**{k: p.views for k, p in self.services.items()}, **changes}
        planned = {
            key: self._calc_planned(node, views, self.services.get(key))
            for key, views in changes.items()
        }
        return self._plan_update(node, self._claim(planned, self.owners))

    def _calc_planned(self, node: NodeView, views: Views, old: Planned | None) -> Planned:
        views = calc_stable_views(views, old.views) if old else views
        elements, shapes = calc_service_parts(ProxyModel(self.family, node, views))
        return Planned(views, tuple(elements), tuple(shapes))

    def _claim(
        self,
        planned: dict[str, Planned],
        owners: Mapping[tuple[str, str], str],
        claimed: dict[tuple[str, str], str] | None = None,
    ) -> dict[str, Planned]:
        """Each map key belongs to one Service: a Service whose VIP, externalIP or nodePort
        port another one already holds (hand-written records; the store's index keys prevent
        it for VIPs and nodePorts) is left out, logged, rather than refusing the whole
        transaction for every Service. The holder keeps it; the other is in ``left_out``,
        which every pass retries, so it is programmed once the holder lets go. ``claimed``
        collects the plan's map keys."""
        claimed = {} if claimed is None else claimed
        for key in sorted(planned):
            mine = _map_keys(planned[key].elements)
            if claimed.keys().isdisjoint(mine) and owners.keys().isdisjoint(mine):
                claimed.update(dict.fromkeys(mine, key))  # nobody else's (a full render's)
                continue
            held = {
                holder
                for k in mine
                if (holder := claimed.get(k) or _holder(owners.get(k), planned)) is not None
            } - {key}
            if held:
                if key not in self.left_out:
                    log.warning(
                        "proxy: Service %s left out: its ports are %s's", key, sorted(held)[0]
                    )
                planned[key] = Planned((), (), (), left_out=True)
            else:
                claimed.update(dict.fromkeys(mine, key))
        return planned

    def send_early(
        self,
        node: NodeView,
        changes: Mapping[str, Views],
        hints: Mapping[str, Planned],
        start: Callable[[str], Started],
    ) -> EarlyRender:
        """A full render's first step, before the other Services are viewed: ``changes``
        (the Services under affinity) planned, and the skeleton with their chains sent by
        ``start`` (``Nft.start_apart``: nft's parse, ~95% of the declarations' at 10k
        Services, then runs beside the rest of the plan). ``plan(..., early=)`` takes it."""
        planned = {k: self._calc_planned(node, v, hints.get(k)) for k, v in changes.items() if v}
        declared = frozenset(s for p in planned.values() for s in p.shapes)
        script = calc_early_declarations(self.family, node, declared)
        return EarlyRender(start(script), script, declared, planned)

    def _plan_full(
        self,
        node: NodeView,
        changes: Mapping[str, Views],
        chains: set[str],
        hints: Mapping[str, Planned],
        early: EarlyRender | None = None,
    ) -> TablePlan:
        """Every Service whole (those ``early`` planned as it did)."""
        first = early.planned if early is not None else {}
        planned = {
            k: first.get(k) or self._calc_planned(node, v, hints.get(k))
            for k, v in changes.items()
            if v
        }
        owners: dict[tuple[str, str], str] = {}
        planned = {
            k: p for k, p in self._claim(planned, {}, owners).items() if p.views or p.left_out
        }
        node_elements = calc_node_elements(ProxyModel(self.family, node))
        parts = (node_elements, *(p.elements for p in planned.values()))
        shapes = set().union(*(p.shapes for p in planned.values()))
        live = calc_shape_chains(shapes)
        stale_sets = {c for c in chains if is_affinity_set(c)}  # an earlier layout's
        stale = {c for c in chains if not is_affinity_set(c)} - live
        sent, started = None, None
        if early is not None:  # a chain sent early whose Service was left out after
            stale |= calc_shape_chains(early.declared) - live
            sent, started = (early.script, early.declared), early.started
        deletes = self._render_deletes(stale, live, stale_sets)
        steps = calc_full_render(self.family, shapes, parts, node, deletes, sent)
        return TablePlan(
            "", True, node, node_elements, planned, {}, owners, steps=steps, started=started
        )

    def _plan_update(self, node: NodeView, planned: dict[str, Planned]) -> TablePlan:
        node_elements = calc_node_elements(ProxyModel(self.family, node))
        element_delta: Counter = Counter()
        shape_delta: Counter = Counter()
        for key, new in planned.items():
            old = self.services.get(key)
            _add_delta(element_delta, old.elements if old else (), new.elements)
            _add_delta(shape_delta, old.shapes if old else (), new.shapes)
        _add_delta(element_delta, self.node_elements, node_elements)
        adds, deletes = _calc_changes(self.element_counts, element_delta)
        new_shapes, old_shapes = _calc_changes(self.shape_counts, shape_delta)
        script = self._render_update(deletes, adds, new_shapes, old_shapes)
        before = {k: self.services[k].views for k in planned if k in self.services}
        shaped = new_shapes or old_shapes  # chains (and sets) change: nft's script alone
        batch = None if shaped else calc_element_batch(self.family, deletes, adds)
        return TablePlan(script, False, node, node_elements, planned, before, elements=batch)

    def _render_update(
        self,
        deletes: list[Element],
        adds: list[Element],
        new_shapes: list[AnyShape],
        old_shapes: list[AnyShape],
    ) -> str:
        """New chains first (an affinity port whose endpoints changed is rewritten in place,
        the clients of its surviving endpoints kept), element deletes (a changed value
        included), adds, then the chains no entry points at any more."""
        change: Counter = Counter()
        change.subtract(shape.chain for shape in old_shapes)
        change.update(shape.chain for shape in new_shapes)
        users = self.name_users  # a name's live shapes once the plan is in: its users now
        # plus the change (only the changed shapes are looked at, never every shape)
        stale = {c for c in calc_shape_chains(old_shapes) if users[c] + change[c] <= 0}
        live_chains = set()
        if calc_index_objects(stale):  # an earlier layout's chain: what still names its objects
            live_chains = {n for n in users if users[n] + change[n] > 0}
        return (
            "".join(render_shape(self.family, s) for s in sorted(new_shapes, key=repr))
            + render_elements(self.family, "delete", deletes)
            + render_elements(self.family, "add", adds)
            + self._render_deletes(stale, live_chains, set())
        )

    def _render_deletes(self, stale: set[str], live: set[str], stale_sets: set[str]) -> str:
        """The stale chains, then the sets they named: an earlier layout's affinity index
        objects (``slot-i``, ``sticky-i``) no live chain uses and its per-endpoint
        ``clients-`` sets (a chain must go, or be rewritten, before what it names)."""
        t = f"{FAMILY[self.family]} {TABLE}"
        objects = calc_index_objects(stale) - calc_index_objects(live)
        return (
            "".join(f"delete chain {t} {c}\n" for c in sorted(stale, key=_referrers_first))
            + "".join(
                f"delete {'map' if 'slot-' in o else 'set'} {t} {o}\n" for o in sorted(objects)
            )
            + "".join(f"delete set {t} {s}\n" for s in sorted(stale_sets))
        )

    def chains(self) -> set[str]:
        """The shape chains this table's elements use (what the kernel holds once
        committed)."""
        return set(self.name_users)

    def commit(self, plan: TablePlan) -> None:
        """The kernel took the plan: hold what it programmed."""
        if plan.full:
            return self._commit_full(plan)
        self.left_out = (self.left_out - set(plan.services)) | {
            k for k, p in plan.services.items() if p.left_out
        }
        for key, new in plan.services.items():
            old = self.services.pop(key, None)
            self.port_count += len(new.views) - (len(old.views) if old else 0)
            _apply_delta(self.element_counts, old.elements if old else (), new.elements)
            appeared, vanished = _apply_delta(
                self.shape_counts, old.shapes if old else (), new.shapes
            )
            _apply_names(self.name_users, appeared, vanished)
            self._move_owners(key, old.elements if old else (), new.elements)
            if new.views:
                self.services[key] = new
        _apply_delta(self.element_counts, self.node_elements, plan.node_elements)
        self.node, self.node_elements = plan.node, plan.node_elements

    def _commit_full(self, plan: TablePlan) -> None:
        """A whole table at once (``TablePlan.tally``)."""
        self.services = {k: p for k, p in plan.services.items() if p.views}
        self.left_out = {k for k, p in plan.services.items() if p.left_out}
        tally = plan.tally
        self.element_counts, self.shape_counts = tally.elements, tally.shapes
        self.name_users, self.port_count = tally.names, tally.ports
        self.owners = dict(plan.owners)
        self.node, self.node_elements = plan.node, plan.node_elements

    def _move_owners(self, key: str, old: Iterable[Element], new: Iterable[Element]) -> None:
        for k in _map_keys(old):
            if self.owners.get(k) == key:
                del self.owners[k]
        self.owners.update(dict.fromkeys(_map_keys(new), key))

    def elements(self) -> frozenset[Element]:
        return frozenset(e for e, n in self.element_counts.items() if n)


ENTRY_MAPS = {
    "service-ips": "vip",
    "no-endpoints": "vip",
    "service-nodeports": "np",
    "no-endpoint-nodeports": "np",
}


CLAIMED_MAPS = {**ENTRY_MAPS, **dict.fromkeys(STICKY_MAPS, "sticky")}


def _map_keys(elements: Iterable[Element]) -> set[tuple[str, str]]:
    """The entry points (VIP or nodePort, protocol, port) the elements claim: an entry is in
    one of its kind's dispatch maps, and its backend keys derive from it; and the affinity
    chain keys (``sticky-backends-P``'s, without the index): two chains' 64-bit keys collide
    only if made to, and the second Service is then left out, not the transaction refused."""
    return {
        (kind, key if kind != "sticky" else key.rpartition(" . ")[0])
        for name, key, _ in elements
        if (kind := CLAIMED_MAPS.get(name))
    }


def _holder(owner: str | None, planned: Mapping[str, Planned]) -> str | None:
    """The committed owner of a key, unless it is being re-planned (its claim is then new)."""
    return None if owner is None or owner in planned else owner


def _add_delta(delta: Counter, old: Iterable, new: Iterable) -> None:
    old, new = set(old), set(new)
    for item in old - new:
        delta[item] -= 1
    for item in new - old:
        delta[item] += 1


def _apply_delta(counts: Counter, old: Iterable, new: Iterable) -> tuple[list, list]:
    """Count ``old`` out and ``new`` in; (appeared, vanished): items now counted that were
    not, and items no longer counted."""
    delta: Counter = Counter()
    _add_delta(delta, old, new)
    appeared, vanished = [], []
    for item, n in delta.items():
        was = counts[item]
        counts[item] += n
        if counts[item] <= 0:
            del counts[item]
            if was > 0:
                vanished.append(item)
        elif was <= 0:
            appeared.append(item)
    return appeared, vanished


def _apply_names(users: Counter, appeared: Iterable[AnyShape], vanished: Iterable[AnyShape]):
    """The chains of the shapes that appeared and vanished, counted in ``users`` (a chain with
    no user left is dropped)."""
    users.update(shape.chain for shape in appeared)
    for shape in vanished:
        users[shape.chain] -= 1
        if users[shape.chain] <= 0:
            del users[shape.chain]


def _calc_changes(counts: Counter, delta: Counter) -> tuple[list, list]:
    """(appearing, disappearing): items whose count goes 0 → n or n → 0."""
    adds = [item for item, n in delta.items() if n > 0 and counts.get(item, 0) == 0]
    deletes = [item for item, n in delta.items() if n < 0 and counts.get(item, 0) + n <= 0]
    return adds, deletes


def calc_stable_views(views: Views, old: Views) -> Views:
    """A ClientIP affinity port whose backends change keeps every surviving backend at its
    place in the port's chain, newcomers take the free places, then the end, and a hole left
    at the end of the list is closed by the last backend. Clients stick to an endpoint's own
    key in ``clients``, so the order moves no client; it keeps the rewritten chain close to
    the one it replaces."""
    before = {(v.port.name, v.port.protocol, v.port.port): v.backends for v in old}
    out = []
    for view in views:
        prior = before.get((view.port.name, view.port.protocol, view.port.port))
        if view.service.affinity_timeout is None or not prior or prior == view.backends:
            out.append(view)
        else:
            out.append(replace(view, backends=calc_stable_order(prior, view.backends)))
    return tuple(out)


def calc_stable_order(
    prior: tuple[Backend, ...], backends: tuple[Backend, ...]
) -> tuple[Backend, ...]:
    """``backends`` in ``prior``'s slots where they were (see ``calc_stable_views``)."""
    wanted = {(b.ip, b.port): b for b in backends}
    slots: list[Backend | None] = [wanted.pop((b.ip, b.port), None) for b in prior]
    newcomers = [b for b in backends if (b.ip, b.port) in wanted]
    slots = [s if s is not None or not newcomers else newcomers.pop(0) for s in slots]
    slots += newcomers
    i = 0
    while i < len(slots):
        if slots[i] is None:
            last = slots.pop()
            if i < len(slots):
                slots[i] = last
            continue
        i += 1
    return tuple(b for b in slots if b is not None)


def _referrers_first(chain: str) -> tuple[bool, str]:
    """An ``aff-`` chain jumps to ``pick-`` chains: it must go first."""
    return "pick-" in chain, chain


def group_views(views: Iterable[ServicePortView]) -> dict[str, Views]:
    """A model's port views by Service key ``namespace/name``."""
    out: dict[str, list[ServicePortView]] = {}
    for view in views:
        out.setdefault(service_key(view), []).append(view)
    return {key: tuple(vs) for key, vs in out.items()}


def service_key(view: ServicePortView) -> str:
    return f"{view.service.namespace}/{view.service.name}"


def render_transaction(m0: ProxyModel | None, m1: ProxyModel) -> str:
    """The script a table holding ``m0`` (None: nothing known) runs to hold ``m1``: what the
    proxy does, for whole models (golden files, tests)."""
    table = ServiceTable(m1.family)
    changes = group_views(m1.ports)
    if m0 is None:
        return table.plan(m1.node, changes, full=True).script
    table.commit(table.plan(m0.node, group_views(m0.ports), full=True))
    gone = {key: () for key in table.services if key not in changes}
    return table.plan(m1.node, {**gone, **changes}).script

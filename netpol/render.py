"""The NetworkPolicy table of one node, ``table inet pycni-netpol``, as an nft script (pure).

``calc_layout(inputs, node, node_ips)`` turns what ``evaluate.py`` judges (``PolicyInputs``)
into the kernel's form of the same verdicts, for the Pods of ``node`` only: isolation is
enforced where the Pod is (egress on the source's node, ingress on the destination's)::

    forward (filter hook forward, priority filter + 10: after pycni-svc's DNAT, so daddr is
             the backend, and before masquerade, so saddr is the client)
      ct state established,related accept        replies and kept connections: no lookup
      ICMPv6 neighbour discovery accept           bridged ND between Pods
      saddr . daddr @self4/6 accept               a Pod to itself
      saddr vmap @egress4/6                       a local Pod isolated for egress → eg-<shape>
      saddr @node4/6 accept                       this node's addresses to its Pods
      daddr vmap @ingress4/6                      a local Pod isolated for ingress → in-<shape>
    in-<shape> / eg-<shape>: one chain per distinct list of isolating policies, shared by
      the Pods it applies to; per policy rule and family, set lookups only: the peers
      (``pods4-<h>``: the addresses of the Pods its selectors pick, a plain set;
      ``blocks4-<h>``: its ipBlocks as intervals), the ports (``ports-<h>``: protocol . port
      ranges) and the named ports (``named4-<h>``: daddr . protocol . port,
      resolved as ``evaluate.port_matches`` resolves them), each set named by its content so
      rules of many chains share it; a match ``return``s: the packet goes on to the other
      end's chain. No match: the Pod's
      counter (``dropped-in/<ns>/<pod>`` through @dropcnt-in4/6), then drop.

A new connection is looked up against the rules of the policies isolating its two ends only,
whatever the number of policies in the cluster; an established packet is accepted by the
first rule. ``render_full`` is one transaction that recreates the contents without deleting
the table (flush, then refill), so a packet sees the old rules or the new, never none;
``diff.py`` turns the table holding one ``Layout`` into the next without the flush.

A render starts from what the previous one kept (``LayoutCache``): a set's elements while
the namespaces it read keep their Pods (``members.Grouping``'s stamps; a peer set whose
namespaces changed their Pods takes those namespaces' parts alone, ``splice``, and a part
no changed Pod entered or left is the same object), a shape chain's rules while each set they
considered is still empty or not (taken without a check while no namespace its sets read
changed, ``Render.unmoved``), each local Pod's entries while the Pod and its namespace's
policies are the same objects (``PodEntries``; after a relabel only the changed Pods',
``Render.patch_pods``). A Pod's relabel at 1,000 policies × 10,000 Pods costs the parts of
the sets that read its namespace (~1 ms), where a render from nothing takes ~0.5 s.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import itertools
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

from netpol.evaluate import PodInfo, PolicyInputs, policies_of
from netpol.members import Grouping, Members, addresses, moved_pairs, to_text
from netpol.policy import NetworkPolicy, Rule

TABLE = "pycni-netpol"
T = f"inet {TABLE}"
PRIORITY = "filter + 10"
FAMILIES = (4, 6)
IP = {4: "ip", 6: "ip6"}
ADDR = {4: "ipv4_addr", 6: "ipv6_addr"}
#: direction -> (chain prefix, the local Pod's address field, the peer's address field)
DIRECTIONS = {"Ingress": ("in", "daddr", "saddr"), "Egress": ("eg", "saddr", "daddr")}
VMAP = {"Ingress": "ingress", "Egress": "egress"}
#: the sets and maps of every layout, without their family digit (``calc_layout``)
STATIC_SETS = frozenset(
    {"self", "node", *VMAP.values(), *(f"dropcnt-{d[0]}" for d in DIRECTIONS.values())}
)
REFERENCE = re.compile(r"@([A-Za-z0-9_.-]+)")  # a set or map a rule names
ND_TYPES = (
    "nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect"
)
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_NAME = 200  # nft names an object in at most 256 bytes
Object = tuple[str, str]  # (kind: chain|set|map|counter, name)


@dataclass(frozen=True)
class NamedSet:
    name: str
    kind: str  # set | map
    type: str
    interval: bool
    elements: tuple[str, ...]

    def declare(self) -> str:
        flags = " flags interval;" if self.interval else ""
        return f"add {self.kind} {T} {self.name} {{ type {self.type};{flags} }}\n"


@dataclass
class Layout:
    """Every object of the table with its contents, and the base chain's rules."""

    sets: dict[str, NamedSet] = field(default_factory=dict)
    chains: dict[str, list[str]] = field(default_factory=dict)  # shape chain -> rules
    counters: set[str] = field(default_factory=set)
    empty: set[str] = field(default_factory=set)  # rule sets without elements: not made
    isolated: dict[str, int] = field(default_factory=lambda: {"Ingress": 0, "Egress": 0})

    @property
    def objects(self) -> frozenset[Object]:
        return frozenset(
            [("chain", "forward")]
            + [("chain", c) for c in self.chains]
            + [(s.kind, s.name) for s in self.sets.values()]
            + [("counter", c) for c in self.counters]
        )


@dataclass(frozen=True)
class Term:
    """A set a rule's terms use: named by its content (given the Pods, for peers and named
    ports), with what computes its elements and what they were computed under (``deps``:
    ``members.Grouping``'s stamps; None for a set its name alone decides)."""

    name: str
    type: str
    interval: bool
    calc: Callable[[Members], Iterable[str]]  # the elements, as nft writes them
    deps: Callable[[Members], object] | None = None
    #: a peer set's elements as parts (``calc_pod_slots``): ``calc``'s elements are their
    #: concatenation, each address once; a changed part alone is spliced in (``splice``)
    slots: Callable[[Members], Slots] | None = None
    #: the Pod label keys its elements depend on (a peer set's: its pod selectors')
    keys: frozenset[str] = frozenset()


Slots = tuple[tuple[str, ...], ...]
#: a peer set whose parts changed in more places than this is computed whole
SPLICE_MAX = 8


@dataclass(frozen=True)
class Made:
    """A set computed in an earlier pass, under ``deps``; ``made`` None: it was empty.
    ``slots``: the parts its elements are exactly the concatenation of (no address in two
    of them), so the next pass may splice; None: computed whole next time."""

    deps: object
    made: NamedSet | None
    slots: Slots | None = None


@dataclass(frozen=True)
class Shape:
    """A shape chain's rules, each set they considered (with whether it had elements: the
    rules leave out an empty one), the sets they name, and the namespaces whose Pods its
    peer sets read (``Render.unmoved``)."""

    rules: list[str]
    terms: tuple[tuple[Term, bool], ...]
    refs: frozenset[str]
    reads: frozenset[str] = frozenset()
    keys: frozenset[str] = frozenset()  # the Pod label keys its peer sets' selectors read


Isolating = tuple[str, list[NetworkPolicy]] | None  # a local Pod's chain and its policies
ChainKey = tuple[object, ...]  # a direction, then the ids of a shape chain's policies
#: the namespaces each peer of a rule reads, the stamps of those namespaces
PeerDeps = tuple[tuple[tuple[str, ...], ...], tuple[int, ...]]


class LayoutCache:
    """What a render keeps for the next (``sync.NetpolSync`` holds one): the Pods' grouping,
    each set computed (kept while its ``deps`` are the same), each shape chain (kept while
    each set it considered is still empty or not as it was), each local Pod's entries (kept
    while the Pod and its namespace's policies are the same objects), the ``self`` and
    ``node`` sets. A label change then costs the sets that read its namespace, not the 1,000
    policies' rules. What a pass did not use is dropped."""

    def __init__(self) -> None:
        self.grouping = Grouping()
        self.sets: dict[str, Made] = {}
        self.shapes: dict[str, Shape] = {}
        self.local_pods: tuple[PodInfo, ...] | None = None  # what ``local`` was made for
        self.local: dict[str, LocalPart] = {}
        #: the local Pods' addresses (``Grouping.local_addresses``) and the node's addresses
        #: the ``self`` and ``node`` sets were made for
        self.static: tuple[int, tuple[str, ...], list[NamedSet]] | None = None


@dataclass(frozen=True)
class PodEntries:
    """One local Pod in one direction: the Pod and its namespace's policies as read, its
    shape chain and policies (None: not isolated), its elements of the direction's maps (in
    ``local_maps`` order) and its drop counter. Kept while the Pod and those policies are the
    same objects: a relabel computes its own Pod's entries, not the node's 100."""

    pod: PodInfo
    policies: object
    found: Isolating
    elements: tuple[tuple[str, ...], ...]
    counter: str | None


@dataclass(frozen=True)
class LocalPart:
    """What a direction's isolated local Pods add to a layout: their maps, filled (vmap
    entries, counter entries), the chains they jump to with their policies (in the order a
    render meets them), their counters, how many they are, each Pod's entries by ref, and
    the policies it read (each local namespace's tuple). Kept whole while the grouping's
    tuple of local Pods and those tuples are the same objects: a pass for another node's Pod
    or a set's change then skips the ~200 Pod lookups and entries (~0.3 ms at 100 Pods)."""

    maps: tuple[NamedSet, ...]
    chains: tuple[tuple[str, list[NetworkPolicy]], ...]
    counters: frozenset[str]
    isolated: int
    pods: dict[str, PodEntries]
    policies: tuple[tuple[str, object], ...]


class Render:
    """One ``calc_layout``: the layout made, and what it used of the cache."""

    def __init__(self, inputs: PolicyInputs, cache: LayoutCache) -> None:
        self.inputs, self.cache = inputs, cache
        self.layout = Layout()
        self.members = Members(inputs, cache.grouping)
        self.sets: dict[str, Made] = {}
        self.shapes: dict[str, Shape] = {}
        self.local: dict[str, LocalPart] = {}
        self.terms: list[tuple[Term, bool]] = []  # those the shape being computed considered
        self.known: dict[ChainKey, str] | None = None  # ``chain_of``'s, made on first use

    def ensure(self, term: Term) -> bool:
        """The set ``term`` in the layout, computed once per render, or taken from an earlier
        one under the same deps; False when it is empty (no set: the rule leaves it out)."""
        layout, name = self.layout, term.name
        if name not in layout.sets and name not in layout.empty:
            deps = term.deps(self.members) if term.deps is not None else None
            made = self.cache.sets.get(name)
            if made is None or made.deps != deps:
                made = self.calc_made(term, deps, made)
            self.sets[name] = made
            if made.made is not None:
                layout.sets[name] = made.made
            else:
                layout.empty.add(name)
        found = name in layout.sets
        self.terms.append((term, found))
        return found

    def calc_made(self, term: Term, deps: object, before: Made | None) -> Made:
        """``term``'s set under ``deps``: a peer set from the one ``before`` with its changed
        parts spliced in, when it can be (``splice``), else computed whole."""
        slots = term.slots(self.members) if term.slots is not None else None
        elements = splice(before, slots) if before is not None and slots is not None else None
        if elements is None:
            elements = tuple(term.calc(self.members))
        exact = slots is not None and len(elements) == sum(map(len, slots))  # no address twice
        return made_of(term, deps, elements, slots if exact else None)

    def calc_pod_entries(self, pod: PodInfo, policies: object, direction: str) -> PodEntries:
        """``pod``'s entries in ``direction`` under its namespace's ``policies``."""
        isolating = policies_of(self.inputs, pod, direction)
        if not isolating:
            return PodEntries(pod, policies, None, NO_ELEMENTS, None)
        prefix = DIRECTIONS[direction][0]
        chain = self.chain_of(direction, isolating)
        counter = counter_name(prefix, pod)
        elements: list[tuple[str, ...]] = []
        for family in FAMILIES:
            ips = addresses(pod, family)
            elements += (
                tuple(f"{ip} : jump {chain}" for ip in ips),
                tuple(f'{ip} : "{counter}"' for ip in ips),
            )
        return PodEntries(pod, policies, (chain, isolating), tuple(elements), counter)

    def chain_of(self, direction: str, policies: list[NetworkPolicy]) -> str:
        """``shape_name``: taken from a chain of the last pass or of this one with the same
        policy objects, else computed (a digest of each policy's JSON, ~60 us for a Pod's
        list). The chains are known by their policies' ids: those of objects the last
        pass's ``LocalPart`` or this pass's entries hold, so no other object has them."""
        if self.known is None:
            self.known = {
                (d, *map(id, held)): chain
                for d, part in self.cache.local.items()
                for chain, held in part.chains
            }
        key = (direction, *map(id, policies))
        found = self.known.get(key)
        if found is None:
            found = self.known[key] = shape_name(DIRECTIONS[direction][0], policies)
        return found

    def ensure_shape(self, chain: str, direction: str, policies: list[NetworkPolicy]) -> None:
        """The chain's rules in the layout: kept from an earlier render while every set they
        considered is still empty or not as it was (the names say the rest), else computed."""
        if chain in self.layout.chains:
            return
        shape = self.cache.shapes.get(chain)
        if shape is not None and not self.unmoved(shape):  # checked set by set
            if self.holds(shape):  # as it was, with the namespaces its sets read now
                reads = self.calc_reads(shape.terms)
                shape = Shape(shape.rules, shape.terms, shape.refs, reads, shape.keys)
            else:
                shape = None
        if shape is None:
            self.terms = []
            rules = calc_shape_rules(self, direction, policies)
            refs = frozenset(m for r in rules for m in REFERENCE.findall(r))
            terms = tuple(self.terms)
            keys = frozenset().union(*(term.keys for term, _had in terms))
            shape = Shape(rules, terms, refs, self.calc_reads(terms), keys)
        self.layout.chains[chain] = shape.rules
        self.shapes[chain] = shape

    def unmoved(self, shape: Shape) -> bool:
        """Nothing ``shape``'s sets read moved since the last kept render (no namespace it
        reads changed its Pods, other than labels its selectors do not read; no picks or
        named ports moved): each set is as that render made it, and goes in the layout
        without computing its deps (~70 a pass). A relabel of a key no peer selector reads
        (the bench's local relabels: ``app``, which policies select by) moves none."""
        grouping = self.cache.grouping
        if grouping.moved_all:
            return False
        reads, read_keys = shape.reads, shape.keys
        for ns, keys in grouping.since.items():
            if ns in reads and (keys is None or not keys.isdisjoint(read_keys)):
                return False
        layout, kept = self.layout, self.cache.sets
        for term, had in shape.terms:
            name = term.name
            if name in self.sets:
                continue
            made = kept.get(name)
            if made is None or (made.made is not None) != had:
                return False  # not kept alike: checked one by one
            self.sets[name] = made
            if made.made is not None:
                layout.sets[name] = made.made
            else:
                layout.empty.add(name)
        return True

    def calc_reads(self, terms: tuple[tuple[Term, bool], ...]) -> frozenset[str]:
        """The namespaces the peer sets of ``terms`` read, by their deps in this render."""
        reads: set[str] = set()
        for term, _had in terms:
            if term.slots is not None:
                picked, _stamps = cast(PeerDeps, self.sets[term.name].deps)  # calc_peer_deps
                for namespaces in picked:
                    reads.update(namespaces)
        return frozenset(reads)

    def holds(self, shape: Shape) -> bool:
        """Each set ``shape`` considered is still empty or not as it was (a loop: all() over
        a generator cost as much as the checks, for ~70 sets a pass)."""
        for term, had in shape.terms:
            if self.ensure(term) != had:
                return False
        return True

    def keep(self, local: tuple[PodInfo, ...]) -> None:
        """Leave in the cache what this render used, and nothing else."""
        cache = self.cache
        cache.sets, cache.shapes = self.sets, self.shapes
        cache.grouping.settle()
        cache.local_pods, cache.local = local, self.local

    def add_local(self, local: tuple[PodInfo, ...], direction: str) -> None:
        """``direction``'s ``LocalPart`` in the layout: the one kept, if it still holds,
        else computed."""
        part = self.cache.local.get(direction) if self.cache.local_pods is local else None
        if part is None or not self.same_policies(part):
            part = self.calc_local(local, direction)
        else:  # as computed: the maps' places first, then the chains' sets
            for declared in part.maps:
                self.layout.sets[declared.name] = declared
            for chain, policies in part.chains:
                self.ensure_shape(chain, direction, policies)
        self.layout.counters |= part.counters
        self.layout.isolated[direction] = part.isolated
        self.local[direction] = part

    def calc_local(self, local: tuple[PodInfo, ...], direction: str) -> LocalPart:
        """``direction``'s part from each local Pod's entries: those of the last pass while
        the Pod and its namespace's policies are the same objects, else computed."""
        layout, names = self.layout, local_maps(direction)
        for name, kind in names:
            layout.sets[name] = NamedSet(name, "map", kind, False, ())
        before = self.cache.local.get(direction)
        found = self.patch_pods(local, direction, before) if before is not None else None
        pods, read = found if found is not None else self.calc_pods(local, direction, before)
        chains: dict[str, list[NetworkPolicy]] = {}
        for entries in pods.values():  # in the Pods' order: a render meets the chains so
            if entries.found is not None and entries.found[0] not in chains:
                chain, isolating = entries.found
                self.ensure_shape(chain, direction, isolating)
                chains[chain] = isolating
        counters = [e.counter for e in pods.values() if e.counter is not None]
        # the maps' columns: each Pod's elements of one map, in the Pods' order
        columns = zip(*(e.elements for e in pods.values()), strict=True) if pods else NO_ELEMENTS
        for (name, kind), column in zip(names, columns, strict=True):  # in their places
            layout.sets[name] = NamedSet(name, "map", kind, False, tuple(chain_all(column)))
        return LocalPart(
            tuple(layout.sets[name] for name, _kind in names),
            tuple(chains.items()),
            frozenset(counters),
            len(counters),
            pods,
            read,
        )

    def same_policies(self, part: LocalPart) -> bool:
        """Each local namespace ``part`` read has the same tuple of policies now."""
        policies_in = self.inputs.policies_in
        return all(policies_in.get(ns, ()) is p for ns, p in part.policies)

    def calc_pods(
        self, local: tuple[PodInfo, ...], direction: str, before: LocalPart | None
    ) -> tuple[dict[str, PodEntries], tuple[tuple[str, object], ...]]:
        """Each local Pod's entries by ref, in order (``before``'s while the Pod and its
        namespace's policies are the same objects), and each local namespace's policies."""
        held = before.pods if before is not None else {}
        policies_in = self.inputs.policies_in
        pods: dict[str, PodEntries] = {}
        read: dict[str, object] = {}
        for pod in local:
            policies = read[pod.namespace] = policies_in.get(pod.namespace, ())
            ref = pod.ref
            entries = held.get(ref)
            if entries is None or entries.pod is not pod or entries.policies is not policies:
                entries = self.calc_pod_entries(pod, policies, direction)
            pods[ref] = entries
        return pods, tuple(read.items())

    def patch_pods(
        self, local: tuple[PodInfo, ...], direction: str, before: LocalPart
    ) -> tuple[dict[str, PodEntries], tuple[tuple[str, object], ...]] | None:
        """``calc_pods`` from ``before``'s entries with those of the few Pods that are not
        the same objects in their places computed again, when the local Pods are the same
        refs in the same order and each local namespace's policies the same objects (a
        relabel); None otherwise. It skips a walk of the ~100 local Pods."""
        was = self.cache.local_pods
        pairs = moved_pairs(was, local) if was is not None else None
        if pairs is None or any(a.ref != b.ref for a, b in pairs):
            return None
        if not self.same_policies(before):
            return None
        policies_in = self.inputs.policies_in
        pods = dict(before.pods)
        for _was, pod in pairs:
            policies = policies_in.get(pod.namespace, ())
            pods[pod.ref] = self.calc_pod_entries(pod, policies, direction)
        return pods, before.policies


def local_maps(direction: str) -> list[tuple[str, str]]:
    """The maps a direction's isolated Pods fill, with their types: per family, the vmap
    (address : verdict) then the drop counters' (address : counter)."""
    prefix = DIRECTIONS[direction][0]
    return [
        (f"{name}{family}", f"{ADDR[family]} : {kind}")
        for family in FAMILIES
        for name, kind in ((VMAP[direction], "verdict"), (f"dropcnt-{prefix}", "counter"))
    ]


NO_ELEMENTS: tuple[tuple[str, ...], ...] = ((), (), (), ())
chain_all = itertools.chain.from_iterable


def made_of(
    term: Term, deps: object, elements: tuple[str, ...], slots: Slots | None = None
) -> Made:
    computed = NamedSet(term.name, "set", term.type, term.interval, elements)
    return Made(deps, computed if elements else None, slots)


def splice(before: Made, slots: Slots) -> tuple[str, ...] | None:
    """The elements of ``slots`` (each address once) from ``before``'s: its elements with
    the parts that are not the same objects replaced, when ``before`` is exactly the
    concatenation of as many parts and few changed; None when it cannot say (computed
    whole). A relabel changes one namespace's part of a set of thousands of addresses."""
    old = before.slots
    if old is None or len(old) != len(slots):
        return None
    changed = [i for i, (was, now) in enumerate(zip(old, slots, strict=True)) if was is not now]
    if len(changed) > SPLICE_MAX:
        return None
    elements = before.made.elements if before.made is not None else ()
    if not changed:  # the namespaces it read changed, not the parts it took of them
        return elements
    pieces: list[tuple[str, ...]] = []
    at = offset = 0
    for i, was in enumerate(old):
        if i in changed:
            pieces += (elements[at:offset], slots[i])
            at = offset + len(was)
        offset += len(was)
    spliced = tuple(itertools.chain.from_iterable((*pieces, elements[at:])))
    for i in changed:  # an address the part did not have may be in another part already
        now, had = slots[i], frozenset(old[i])
        if len(set(now)) != len(now) or any(spliced.count(a) > 1 for a in now if a not in had):
            return None
    return spliced


def calc_layout(
    inputs: PolicyInputs,
    node: str,
    node_ips: Iterable[str] = (),
    cache: LayoutCache | None = None,
) -> Layout:
    """``cache``: what the previous render kept (``LayoutCache``; None: computed afresh)."""
    run = Render(inputs, cache if cache is not None else LayoutCache())
    layout = run.layout
    local = run.cache.grouping.local_pods(node)
    ips, held, stamp = tuple(node_ips), run.cache.static, run.cache.grouping.local_addresses
    if held is None or held[0] != stamp or held[1] != ips:
        held = run.cache.static = (stamp, ips, calc_static_sets(local, ips))
    for declared in held[2]:
        layout.sets[declared.name] = declared
    for direction in DIRECTIONS:
        run.add_local(local, direction)
    _drop_unreferenced(layout, run.shapes.values())
    run.keep(local)
    return layout


def calc_static_sets(local: tuple[PodInfo, ...], node_ips: tuple[str, ...]) -> list[NamedSet]:
    """Per family, ``self`` (each local Pod's address . itself) and ``node`` (the node's
    addresses): kept while the local Pods' addresses and the node's are
    (``LayoutCache.static``)."""
    node_addresses = [ipaddress.ip_address(a.split("/")[0]) for a in node_ips]
    found = []
    for family in FAMILIES:
        own = tuple(f"{a} . {a}" for p in local for a in addresses(p, family))
        pair = f"{ADDR[family]} . {ADDR[family]}"
        found.append(NamedSet(f"self{family}", "set", pair, False, own))
        nodes = tuple(sorted({str(a) for a in node_addresses if a.version == family}))
        found.append(NamedSet(f"node{family}", "set", ADDR[family], True, nodes))
    return found


def _drop_unreferenced(layout: Layout, shapes: Iterable[Shape]) -> None:
    """A rule's port and peer sets are made as its terms are computed, and a rule that ends up
    empty (peers that pick no Pod in a family, named ports no Pod serves) references none of
    them: such a set is dropped, not declared in the kernel (``pycni doctor`` counts a set
    nothing reaches as left behind)."""
    used = frozenset().union(*(shape.refs for shape in shapes))
    for name in [n for n in layout.sets if not _is_static(n) and n not in used]:
        del layout.sets[name]


def _is_static(name: str) -> bool:
    """The sets and maps every layout declares (``calc_layout``): the rest are rules' terms."""
    return name.rstrip("46") in STATIC_SETS


def counter_name(prefix: str, pod: PodInfo) -> str:
    """``dropped-in/<ns>/<pod>``; a name nft would refuse as too long (objects: 256 bytes;
    a Pod name may have 253) is the hash of it instead."""
    name = f"dropped-{prefix}/{pod.namespace}/{pod.name}"
    return name if len(name) <= MAX_NAME else f"dropped-{prefix}/{digest(name)}"


def shape_name(prefix: str, policies: list[NetworkPolicy]) -> str:
    """The chain of one sorted list of policies: named by their content, so a changed policy
    is a new chain and the kernel never holds a chain whose rules are half old."""
    return f"{prefix}-{digest([p.to_dict() for p in policies])}"


def calc_shape_rules(run: Render, direction: str, policies: list[NetworkPolicy]) -> list[str]:
    prefix, own, _peer = DIRECTIONS[direction]
    rules: list[str] = []
    for policy in policies:
        for rule in policy.ingress if direction == "Ingress" else policy.egress:
            rules += calc_rule(run, direction, policy, rule)
    for family in FAMILIES:
        rules.append(f"counter name {IP[family]} {own} map @dropcnt-{prefix}{family}")
    return rules + ["counter drop"]


def calc_rule(run: Render, direction: str, policy: NetworkPolicy, rule: Rule) -> list[str]:
    """One policy rule as nft rules (an OR of them), each ending in ``return``: peers AND
    ports, where a term absent from the rule is left out (any)."""
    _prefix, _own, peer = DIRECTIONS[direction]
    ports, named = calc_port_terms(run, rule)
    if rule.ports and not ports and not named:
        return []
    port_terms = {f: [t for t in (ports, named.get(f)) if t] for f in FAMILIES}
    if not rule.peers:
        if not rule.ports:
            return ["return"]
        terms = [ports] if ports else []
        terms += [named[f] for f in FAMILIES if f in named]
        return [f"{t} return" for t in terms]
    rules: list[str] = []
    for family in FAMILIES:
        terms = port_terms[family] if rule.ports else [""]
        rules += [
            f"{IP[family]} {peer} @{name} {t} return".replace("  ", " ")
            for name in calc_peer_sets(run, policy, rule, family)
            for t in terms
        ]
    return rules


def calc_peer_sets(run: Render, policy: NetworkPolicy, rule: Rule, family: int) -> list[str]:
    """The sets of a rule's peers in ``family`` that are not empty: the addresses of the Pods
    its selectors pick (``pods4-<h>``: a plain set, so a Pod's change is elements a netlink
    batch can carry; named by the selectors and, for those without a namespaceSelector, the
    policy's namespace: rules of many namespaces share it) and its ipBlocks (``blocks4-<h>``:
    intervals, named by the blocks alone, so their elements never change)."""
    selectors = [  # a peer without a namespaceSelector picks in the policy's namespace only
        [policy.namespace if p.namespace_selector is None else None, p.to_dict()]
        for p in rule.peers
        if p.ip_block is None
    ]
    blocks = [p.to_dict() for p in rule.peers if p.ip_block is not None]
    found = []
    if selectors:
        name = f"pods{family}-{digest(selectors)}"
        calc = functools.partial(calc_pod_elements, policy=policy, rule=rule, family=family)
        deps = functools.partial(calc_peer_deps, policy=policy, rule=rule)
        slots = functools.partial(calc_pod_slots, policy=policy, rule=rule, family=family)
        keys = frozenset().union(
            *(p.pod_selector.keys for p in rule.peers if p.pod_selector is not None)
        )
        if run.ensure(Term(name, ADDR[family], False, calc, deps, slots, keys)):
            found.append(name)
    if blocks:
        name = f"blocks{family}-{digest(blocks)}"
        blocks_of = functools.partial(calc_block_elements, rule, family)
        if run.ensure(Term(name, ADDR[family], True, lambda _members: blocks_of())):
            found.append(name)
    return found


def calc_port_terms(run: Render, rule: Rule) -> tuple[str, dict[int, str]]:
    """The numeric ports' term (protocol . port intervals) and, per family, the named
    ports' term (daddr . protocol . port), each backed by a set named by its content (one
    per distinct port list, whichever rules share it); '' / absent when empty."""
    numeric = calc_port_elements(rule)
    ports = ""
    if numeric:
        name = f"ports-{digest(numeric)}"
        run.ensure(Term(name, "inet_proto . inet_service", True, lambda _members: numeric))
        ports = f"meta l4proto . th dport @{name}"
    names = sorted({(p.port, p.protocol) for p in rule.ports if isinstance(p.port, str)})
    named: dict[int, str] = {}
    for family in FAMILIES if names else ():
        name = f"named{family}-{digest(names)}"
        calc = functools.partial(calc_named_elements, names=names, family=family)
        term = Term(name, f"{ADDR[family]} . inet_proto . inet_service", False, calc, named_deps)
        if run.ensure(term):
            named[family] = f"{IP[family]} daddr . meta l4proto . th dport @{name}"
    return ports, named


def calc_pod_elements(
    members: Members, policy: NetworkPolicy, rule: Rule, family: int
) -> list[str]:
    """The ``family`` addresses of the Pods a rule's selector peers pick, each once: its
    slots (``calc_pod_slots``) concatenated."""
    slots = calc_pod_slots(members, policy, rule, family)
    return list(dict.fromkeys(itertools.chain.from_iterable(slots)))


def calc_pod_slots(members: Members, policy: NetworkPolicy, rule: Rule, family: int) -> Slots:
    """``calc_pod_elements`` before the concatenation: each selector peer's part of each
    namespace it picks, in order."""
    return tuple(
        itertools.chain.from_iterable(
            members.peer_parts(policy, peer, family) for peer in rule.peers
        )
    )


def calc_peer_deps(members: Members, policy: NetworkPolicy, rule: Rule) -> PeerDeps:
    """What a rule's selector peers pick depends on: the namespaces each peer looks in
    (picked again by the namespaces' labels), and each of those namespaces' Pods' stamp.
    Per peer: a namespace that one peer stops picking while another still does (all its
    Pods, then only those of a pod selector) leaves the union as it was, not the set."""
    picked = tuple(members.peer_namespaces(policy, p) for p in rule.peers)
    namespaces = tuple(dict.fromkeys(itertools.chain.from_iterable(picked)))
    return picked, members.grouping.stamp_of(namespaces)


def named_deps(members: Members) -> object:
    """Named ports resolve on every Pod: their sets hold while no Pod's named ports moved."""
    return members.grouping.named_stamp


def calc_block_elements(rule: Rule, family: int) -> list[str]:
    return [
        to_text(low, family) if low == high else f"{to_text(low, family)}-{to_text(high, family)}"
        for low, high in calc_block_members(rule, family)
    ]


def calc_named_elements(members: Members, names: list[tuple[str, str]], family: int) -> list[str]:
    return sorted({e for n, proto in names for e in members.named_port(n, proto, family)})


def digest(content: object) -> str:
    text = json.dumps(content, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def calc_block_members(rule: Rule, family: int) -> list[tuple[int, int]]:
    """The addresses a rule's ipBlocks (CIDR minus excepts) hold in ``family``, as disjoint,
    merged intervals of integers: what an interval set takes."""
    found = []
    for peer in rule.peers:
        block = peer.ip_block
        if block is not None and block.cidr.version == family:
            found += [
                (int(n.network_address), int(n.broadcast_address))
                for n in _subtract(block.cidr, block.excepts)
            ]
    return merge_intervals(found)


def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(intervals):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def _subtract(cidr: Network, excepts: Iterable[Network]) -> list[Network]:
    parts = [cidr]
    for cut in excepts:
        parts = [
            n
            for part in parts
            for n in (
                part.address_exclude(cut)  # type: ignore[arg-type]
                if cut.subnet_of(part)  # type: ignore[arg-type]
                else ([] if part.subnet_of(cut) else [part])  # type: ignore[arg-type]
            )
        ]
    return parts


def render_full(layout: Layout, stale: Iterable[Object] = (), batched: Iterable[str] = ()) -> str:
    """One transaction: the table made if missing, its rules flushed, every set and map
    flushed and refilled, every chain's rules written again; ``stale`` (objects a previous
    render made that this one does not) deleted once nothing refers to them. The elements
    of the ``batched`` sets are left out (``diff.calc_first_render`` sends them apart)."""
    batched = frozenset(batched)
    out = [f"add table {T}\n", f"flush table {T}\n"]
    hook = f"type filter hook forward priority {PRIORITY}; policy accept;"
    out.append(f"add chain {T} forward {{ {hook} }}\n")
    out += [s.declare() for s in layout.sets.values()]
    out += [f"flush {s.kind} {T} {s.name}\n" for s in layout.sets.values()]
    out += [f"add counter {T} {c}\n" for c in sorted(layout.counters)]
    out += [f"add chain {T} {c}\n" for c in layout.chains]
    out += render_deletes(stale, layout.objects)
    out += [
        f"add element {T} {s.name} {{ {', '.join(s.elements)} }}\n"
        for s in layout.sets.values()
        if s.elements and s.name not in batched
    ]
    out += [f"add rule {T} forward {r}\n" for r in render_base_rules()]
    out += [f"add rule {T} {c} {r}\n" for c, rules in layout.chains.items() for r in rules]
    return "".join(out)


def render_deletes(stale: Iterable[Object], live: frozenset[Object]) -> list[str]:
    """Sets and maps first (a vmap refers to chains, a counter map to counters), then
    chains and counters. Runs after the flushes, so no rule or element refers to them."""
    order = {"set": 0, "map": 0, "chain": 1, "counter": 2}
    gone = sorted(set(stale) - live, key=lambda o: (order[o[0]], o[1]))
    return [f"delete {kind} {T} {name}\n" for kind, name in gone]


def render_base_rules() -> list[str]:
    rules = ["ct state established,related accept", f"icmpv6 type {{ {ND_TYPES} }} accept"]
    for f in FAMILIES:
        rules.append(f"{IP[f]} saddr . {IP[f]} daddr @self{f} accept")
    rules += [f"{IP[f]} saddr vmap @egress{f}" for f in FAMILIES]
    rules += [f"{IP[f]} saddr @node{f} accept" for f in FAMILIES]
    rules += [f"{IP[f]} daddr vmap @ingress{f}" for f in FAMILIES]
    return rules


def calc_port_elements(rule: Rule) -> list[str]:
    """``protocol . port`` or ``protocol . low-high`` of the numeric ports (no port: all of
    the protocol), merged per protocol: an interval set refuses overlapping elements
    (``port: 80`` beside ``80-81``)."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    for p in rule.ports:
        if isinstance(p.port, str):
            continue
        low, high = (0, 65535) if p.port is None else (p.port, p.end_port or p.port)
        ranges.setdefault(p.protocol.lower(), []).append((low, high))
    return [
        f"{protocol} . {low}" if low == high else f"{protocol} . {low}-{high}"
        for protocol, found in sorted(ranges.items())
        for low, high in merge_intervals(found)
    ]

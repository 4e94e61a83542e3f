"""Who a peer picks and where a named port resolves, indexed once per render (pure).

``render.py`` asks for each rule of each policy isolating a local Pod: the addresses of the
Pods a peer's selectors pick, and the (address, protocol, port) where a named port resolves.
Asking ``evaluate.peer_matches`` for every Pod of the cluster per rule cost minutes at 1,000
policies × 10,000 Pods; here the Pods are grouped by namespace, a peer's namespaces are
found by matching the namespaces' labels once, and each canonical peer (its namespace
scope and selectors) and each port name is computed once and shared. The meaning is
``evaluate.peer_matches`` / ``PodInfo.resolve``'s (tests/unit/test_netpol_render.py checks
both against every Pod).

What depends on one namespace's Pods alone (the Pods a pod selector picks there, the named
ports they have) and which namespaces a namespace selector picks is kept between passes in a
``Grouping``: a pass groups the Pods again (their ``PodInfo`` objects are kept by
``view.PodCache`` while unchanged, so a changed namespace is one whose Pods are not the same
objects) and recomputes only what the changed namespaces, or changed namespace labels, touch.
At 10,000 Pods the named ports and the namespace-selector peers were most of a pass's layout
(0.3-0.6 s of it on this machine), for a change of one Pod.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import socket
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Generic, Protocol, TypeVar, overload

from netpol.evaluate import NamedPort, PodInfo, PolicyInputs, pod_infos
from netpol.policy import NetworkPolicy, Peer
from netpol.selector import LabelSelector

AF = {4: socket.AF_INET, 6: socket.AF_INET6}
PeerKey = tuple[str | None, LabelSelector | None, LabelSelector | None, int]
NamedKey = tuple[str, str, int]  # port name, protocol, family
PartKey = tuple[LabelSelector | None, int]  # a namespace's Pods' selector (None: all), family
Moved = tuple[PodInfo, PodInfo]  # a Pod before and after a namespace's change
MOVED_MAX = 8  # a namespace with more Pods changed than this computes its parts again


class Grouping:
    """The Pods by namespace and what derives from one namespace's Pods, kept from pass to
    pass (``update``: only the namespaces whose Pods changed are computed again).

    Each namespace whose Pods changed gets a new ``stamp``, and ``named_stamp`` moves when the
    named ports of some Pod did: what the renderer keeps between passes
    (``render.LayoutCache``) holds, beside each set's elements, the stamps it read them
    under."""

    def __init__(self) -> None:
        self.pods: Sequence[PodInfo] | None = None
        self.labels: Mapping[str, Mapping[str, str]] | None = None
        self.by_namespace: Mapping[str, tuple[PodInfo, ...]] = {}
        #: namespace -> (its Pods' selector, family) -> their addresses (``part``)
        self.parts: dict[str, dict[PartKey, tuple[str, ...]]] = {}
        #: a namespace whose Pods changed in the last ``regroup``, when they are as many as
        #: before: its parts before, and the Pods that are not the same objects (before, now)
        self.moved: dict[str, tuple[dict[PartKey, tuple[str, ...]], list[Moved]]] = {}
        self.named: dict[str, dict[NamedKey, tuple[str, ...]]] = {}
        self.picks: dict[LabelSelector, tuple[str, ...]] = {}
        self.clock = 0  # the last stamp given: stamps never repeat
        self.stamps: dict[str, int] = {}  # namespace -> the stamp of its Pods
        self.named_stamp = 0
        #: since the last render that kept what it computed (``settle``): the namespaces whose
        #: Pods changed, each with the label keys that changed when nothing else did (the same
        #: Pods with the same addresses: ``changed_label_keys``; None: anything may have), and
        #: whether a namespace selector's picks or the named ports may have (a shape chain
        #: none of whose sets read those namespaces, or the keys they changed, then holds)
        self.since: dict[str, frozenset[str] | None] = {}
        self.moved_all = True
        #: the port names some policy's rule names, read from ``wanted_from`` (the inputs'
        #: policies): only those of a Pod's named ports are elements (``named_in``)
        self.wanted: frozenset[str] = frozenset()
        self.wanted_from: Sequence[NetworkPolicy] | None = None
        #: each namespace's policies (the tuple read) and their port names (``calc_wanted``)
        self.names_in: dict[str, tuple[tuple[NetworkPolicy, ...], frozenset[str]]] = {}
        self.kept_ports: dict[tuple[NamedPort, ...], tuple[NamedPort, ...]] = {}
        self.local_node: str | None = None
        self.local_in: dict[str, tuple[PodInfo, ...]] = {}  # namespace -> its Pods on the node
        self.local: tuple[PodInfo, ...] | None = None  # every one, by ref; None: to compute
        #: moves when the addresses of the local Pods, in their order, may have: a relabel
        #: changes the local Pods, not what the ``self`` sets hold
        self.local_addresses = 0

    def update(self, inputs: PolicyInputs) -> None:
        if inputs.pods is not self.pods:
            groups = (
                inputs.groups if inputs.groups is not None else group_by_namespace(inputs.pods)
            )
            self.regroup(groups)
            self.pods = inputs.pods
        if inputs.namespaces != self.labels:
            self.clear_picks()
            self.labels = inputs.namespaces
        if inputs.policies is not self.wanted_from:
            self.wanted_from = inputs.policies
            wanted = self.calc_wanted(inputs.policies_in)
            if wanted != self.wanted:  # every namespace's elements computed again
                self.wanted, self.kept_ports = wanted, {}
                self.named.clear()
                self.move_named()

    def calc_wanted(self, policies_in: Mapping[str, tuple[NetworkPolicy, ...]]) -> frozenset[str]:
        """The port names of every namespace's policies, each namespace's kept while its
        tuple is the same object (a policy change reads its namespace's ~10 policies, not
        the 1,000)."""
        held = self.names_in
        self.names_in = {
            ns: found
            if (found := held.get(ns)) is not None and found[0] is group
            else (group, named_port_names(group))
            for ns, group in policies_in.items()
        }
        return frozenset().union(*(names for _group, names in self.names_in.values()))

    def clear_picks(self) -> None:
        self.picks.clear()
        self.moved_all = True

    def move_named(self) -> None:
        self.named_stamp = self.tick()
        self.moved_all = True

    def settle(self) -> None:
        """A render kept what it computed (``render.LayoutCache``): what moved since is
        counted from here."""
        self.since.clear()
        self.moved_all = False

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def regroup(self, fresh: Mapping[str, tuple[PodInfo, ...]]) -> None:
        """Take ``fresh`` (namespace -> its Pods by ref; an unchanged namespace's Pods the
        same objects): what derives from a namespace whose Pods changed is dropped."""
        before = self.by_namespace
        changed = [
            ns
            for ns in fresh.keys() | before.keys()
            if not same_objects(fresh.get(ns, ()), before.get(ns, ()))
        ]
        if fresh.keys() != before.keys():
            self.clear_picks()  # a namespace selector picks among namespaces with Pods
        self.moved = {}
        moved = {ns: moved_pairs(before.get(ns, ()), fresh.get(ns, ())) for ns in changed}
        for ns, pairs in moved.items():
            keys = changed_label_keys(pairs)
            if ns in self.since:  # changed already since the last kept render
                earlier = self.since[ns]
                keys = None if earlier is None or keys is None else earlier | keys
            self.since[ns] = keys
            parts = self.parts.pop(ns, None)
            if parts and pairs is not None:
                self.moved[ns] = (parts, pairs)
        self.by_namespace = fresh
        for ns, pairs in moved.items():
            named = self.named.pop(ns, None)
            if ns not in fresh:  # gone: a later one of that name gets a stamp above 0
                self.stamps.pop(ns, None)
                if named:
                    self.move_named()
                if self.local_in.pop(ns, ()):
                    self.local, self.local_addresses = None, self.tick()
                continue
            self.stamps[ns] = self.tick()
            if named is not None and same_ports(pairs, before.get(ns, ()), fresh[ns]):
                self.named[ns] = named  # a relabel: the same elements, not computed again
            elif named is None and not self.wanted:
                pass  # no policy names a port: there are no named-port elements to move
            elif named is None or named != self.named_in(ns):
                self.move_named()
            local = tuple(p for p in fresh[ns] if p.node == self.local_node)
            was = self.local_in.get(ns, ())
            if local != was:
                self.local = None
                if [p.ips for p in local] != [p.ips for p in was]:
                    self.local_addresses = self.tick()
            self.local_in[ns] = local

    def local_pods(self, node: str) -> tuple[PodInfo, ...]:
        """The Pods of ``node``, by ref."""
        if node != self.local_node:
            self.local_node, self.local, self.local_addresses = node, None, self.tick()
            self.local_in = {
                ns: tuple(p for p in pods if p.node == node)
                for ns, pods in self.by_namespace.items()
            }
        if self.local is None:
            self.local = pod_infos(p for pods in self.local_in.values() for p in pods)
        return self.local

    def stamp_of(self, namespaces: Iterable[str]) -> tuple[int, ...]:
        return tuple(self.stamps.get(ns, 0) for ns in namespaces)

    def pick(self, selector: LabelSelector, inputs: PolicyInputs) -> tuple[str, ...]:
        """The namespaces with Pods whose labels ``selector`` matches, sorted."""
        found = self.picks.get(selector)
        if found is None:
            found = self.picks[selector] = tuple(
                sorted(
                    ns for ns in self.by_namespace if selector.matches(inputs.namespace_labels(ns))
                )
            )
        return found

    def part(self, ns: str, selector: LabelSelector | None, family: int) -> tuple[str, ...]:
        """The ``family`` addresses of the Pods of ``ns`` that ``selector`` picks (None: all):
        the same object as before the namespace's Pods changed when no Pod that changed
        entered, left or moved its addresses in it (a relabel changes the parts of the
        selectors that read the labels it changed, not all of its namespace's)."""
        key = (selector, family)
        held = self.parts.get(ns)
        if held is None:
            held = self.parts[ns] = {}
        found = held.get(key)
        if found is None:
            found = held[key] = self._kept_part(ns, key) or tuple(
                ip
                for pod in self.by_namespace.get(ns, ())
                if selector is None or selector.matches(pod.labels)
                for ip in addresses(pod, family)
            )
        return found

    def _kept_part(self, ns: str, key: PartKey) -> tuple[str, ...] | None:
        """The part before the namespace's last change, if each Pod that changed gives it
        what it gave; None: computed again."""
        parts, pairs = self.moved.get(ns, ({}, []))
        found = parts.get(key)
        if found is None:
            return None
        selector, family = key
        for was, now in pairs:
            picked = selector is None or selector.matches(was.labels)
            if picked != (selector is None or selector.matches(now.labels)):
                return None
            if picked and addresses(was, family) != addresses(now, family):
                return None
        return found

    def named_in(self, ns: str) -> dict[NamedKey, tuple[str, ...]]:
        """The named-port elements of the Pods of ``ns``, by (name, protocol, family), of
        the names some policy uses (``wanted``): a Pod's other named ports are in no set, and
        their elements were a third of the strings held at 10,000 Pods with three named
        ports."""
        found = self.named.get(ns)
        if found is None:
            named: dict[NamedKey, list[str]] = defaultdict(list)
            for pod in self.by_namespace.get(ns, ()):
                ports = self.wanted_ports(pod.ports) if pod.ports else ()
                if ports:
                    v4, v6 = pod.families
                    keys = calc_named_keys(ports, len(v4), len(v6))
                    elements = calc_named_elements(ports, pod.ips)
                    for key, element in zip(keys, elements, strict=True):
                        named[key].append(element)
            found = self.named[ns] = {k: tuple(v) for k, v in named.items()}
        return found

    def wanted_ports(self, ports: tuple[NamedPort, ...]) -> tuple[NamedPort, ...]:
        """``ports`` of the ``wanted`` names, in order: one tuple per distinct ports."""
        kept = self.kept_ports.get(ports)
        if kept is None:
            kept = self.kept_ports[ports] = tuple(p for p in ports if p.name in self.wanted)
        return kept


def named_port_names(policies: Iterable[NetworkPolicy]) -> frozenset[str]:
    """The port names the rules of ``policies`` use."""
    return frozenset().union(*(policy.port_names for policy in policies))


RESORT = 64  # more replaced at once than this: sort them all again


class Named(Protocol):
    """A Pod or a policy: named within its namespace."""

    @property
    def namespace(self) -> str: ...

    @property
    def ref(self) -> str: ...


N = TypeVar("N", bound=Named)


class Flat(Sequence[N]):
    """The items of ``groups`` (namespace -> its items by ref) in ref order, made into one
    tuple on first use: a pass reads the groups, and a tuple of the 10,000 Pods made again for
    each change, every Pod's reference count touched, was 0.16 ms of a relabel pass in
    pycnid. A namespace's refs are ``ns/…``, so the namespaces sorted with their '/' give the
    refs' order. ``groups`` is never changed after (``RefOrder`` makes a new mapping)."""

    __slots__ = ("groups", "_items")

    def __init__(self, groups: Mapping[str, tuple[N, ...]]) -> None:
        self.groups = groups
        self._items: tuple[N, ...] | None = None

    @property
    def items(self) -> tuple[N, ...]:
        if self._items is None:
            order = sorted(self.groups, key=lambda ns: f"{ns}/")
            self._items = tuple(itertools.chain.from_iterable(self.groups[ns] for ns in order))
        return self._items

    def __len__(self) -> int:
        if self._items is None:
            return sum(map(len, self.groups.values()))
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> N: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[N, ...]: ...

    def __getitem__(self, index: int | slice) -> N | tuple[N, ...]:
        return self.items[index]

    def __iter__(self) -> Iterator[N]:
        return iter(self.items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Flat):
            other = other.items
        return isinstance(other, tuple) and self.items == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Flat({self.items!r})"


class RefOrder(Generic[N]):
    """Pods or policies sorted by ref (``sorted``) and by namespace (``groups``), kept as
    they are replaced: moved in place when they are few (sorting 10,000 Pods by ref was tens
    of ms of every pass), and a namespace none of whose members changed keeps its tuple, so
    what was computed from it is kept (``Grouping``, ``render.LayoutCache``); ``KeyedOrder``
    keeps one for each source's Pods and policies."""

    def __init__(self) -> None:
        self.order: list[N] = []  # ``sorted`` as a list, and its refs
        self.refs: list[str] = []
        self.groups: dict[str, tuple[N, ...]] = {}
        self.sorted: Flat[N] = Flat(self.groups)

    def replace(
        self, replaced: list[tuple[N | None, N | None]], every: Callable[[], Iterable[N]]
    ) -> None:
        """The (old, new) ones replaced (None: none); ``every``: all of them after it."""
        if len(replaced) > RESORT:
            self.order = sorted(every(), key=lambda found: found.ref)
            self.refs = [found.ref for found in self.order]
            self.groups = group_by_namespace(self.order)
            self.sorted = Flat(self.groups)
            return
        touched: set[str] = set()
        for old, new in replaced:
            if old is not None:
                at = bisect.bisect_left(self.refs, old.ref)
                del self.order[at], self.refs[at]
                touched.add(old.namespace)
            if new is not None:
                at = bisect.bisect_left(self.refs, new.ref)
                self.order.insert(at, new)
                self.refs.insert(at, new.ref)
                touched.add(new.namespace)
        groups = dict(self.groups)  # a new mapping: the inputs handed out keep theirs
        for ns in touched:
            # a namespace's refs are ``ns/…``: one run of the sorted refs ('0' follows '/')
            low = bisect.bisect_left(self.refs, f"{ns}/")
            found = tuple(self.order[low : bisect.bisect_left(self.refs, f"{ns}0", low)])
            if found:
                groups[ns] = found
            else:
                groups.pop(ns, None)
        self.groups = groups
        self.sorted = Flat(groups)


K = TypeVar("K", bound=Hashable)


class KeyedOrder(RefOrder[N], Generic[K, N]):
    """The ``RefOrder`` of a mapping's values, following its changes by key (``follow``):
    the Pods of ``view.PodCache`` and of ``from_kube.PolicyObjects``, the policies of
    ``view.Records`` and of ``from_kube.PolicyObjects``."""

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[K, N] = {}  # key -> the item in the order

    def follow(self, items: Mapping[K, N | None], touched: Iterable[K] | None) -> None:
        """``touched``: the keys put or deleted since the last call (None: every key)."""
        keys = items.keys() | self.held.keys() if touched is None else touched
        replaced: list[tuple[N | None, N | None]] = []
        for key in keys:
            old, new = self.held.get(key), items.get(key)
            if old is new:
                continue
            if new is None:
                del self.held[key]
            else:
                self.held[key] = new
            replaced.append((old, new))
        if replaced:
            self.replace(replaced, self.held.values)


def group_by_namespace(items: Iterable[N]) -> dict[str, tuple[N, ...]]:
    """Pods or policies by namespace, each namespace's in the order given."""
    grouped: dict[str, list[N]] = defaultdict(list)
    for item in items:
        grouped[item.namespace].append(item)
    return {ns: tuple(found) for ns, found in grouped.items()}


def moved_pairs(was: tuple[PodInfo, ...], now: tuple[PodInfo, ...]) -> list[Moved] | None:
    """A namespace's Pods that are not the same objects, (before, now) by place; None when
    they are not as many, or more than ``MOVED_MAX`` changed."""
    if len(was) != len(now):
        return None
    pairs = [(a, b) for a, b in zip(was, now, strict=True) if a is not b]
    return pairs if len(pairs) <= MOVED_MAX else None


def changed_label_keys(pairs: list[Moved] | None) -> frozenset[str] | None:
    """The label keys a namespace's change moved, when it moved nothing else a part reads
    (``pairs``: ``moved_pairs``; each Pod the same ref in the same place, with the same
    addresses: a relabel); None otherwise. A part whose selector reads none of these keys
    picks the same Pods, so the same addresses."""
    if pairs is None:
        return None
    keys: set[str] = set()
    for was, now in pairs:
        if was.ref != now.ref or was.ips != now.ips:
            return None
        old, new = was.labels, now.labels
        keys.update(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    return frozenset(keys)


def same_ports(pairs: list[Moved] | None, a: tuple[PodInfo, ...], b: tuple[PodInfo, ...]) -> bool:
    """Pods in the same order with the same named ports and addresses: ``named_in`` gives
    the same elements for both (~0.3 ms a relabel pass for 100 Pods, and the most a label
    change costs when nothing else it touches changed). ``pairs``: ``moved_pairs(a, b)``,
    the only Pods to compare when known."""
    if pairs is not None:
        return all(x.ports == y.ports and x.ips == y.ips for x, y in pairs)
    return len(a) == len(b) and all(
        x.ports == y.ports and x.ips == y.ips for x, y in zip(a, b, strict=True)
    )


def same_objects(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """The same objects in the same order (what a pass kept unchanged: compared by identity)."""
    return a is b or len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


class Members:
    """``grouping``: the one kept from the previous pass (None: computed for these inputs)."""

    def __init__(self, inputs: PolicyInputs, grouping: Grouping | None = None) -> None:
        self.inputs = inputs
        self.grouping = grouping if grouping is not None else Grouping()
        self.grouping.update(inputs)
        self.named: dict[NamedKey, tuple[str, ...]] = {}
        self.peers: dict[PeerKey, tuple[str, ...]] = {}
        self.parts: dict[PeerKey, tuple[tuple[str, ...], ...]] = {}

    def peer_addresses(self, policy: NetworkPolicy, peer: Peer, family: int) -> tuple[str, ...]:
        """The ``family`` addresses of the Pods a selector peer picks (``ipBlock``: none)."""
        if peer.ip_block is not None:
            return ()
        key = peer_key(policy, peer, family)
        found = self.peers.get(key)
        if found is None:
            found = self.peers[key] = tuple(
                itertools.chain.from_iterable(self.peer_parts(policy, peer, family))
            )
        return found

    def peer_parts(
        self, policy: NetworkPolicy, peer: Peer, family: int
    ) -> tuple[tuple[str, ...], ...]:
        """``peer_addresses`` by namespace picked, in order: each namespace's part is the
        same object from pass to pass while its Pods are (``Grouping.part``), so a set made
        from them can take the changed namespaces' parts alone (``render.splice``)."""
        if peer.ip_block is not None:
            return ()
        key = peer_key(policy, peer, family)
        found = self.parts.get(key)
        if found is None:
            found = self.parts[key] = self._calc_peer_parts(key)
        return found

    def peer_namespaces(self, policy: NetworkPolicy, peer: Peer) -> tuple[str, ...]:
        """The namespaces a selector peer picks its Pods in (``ipBlock``: none)."""
        if peer.ip_block is not None:
            return ()
        if peer.namespace_selector is None:
            return (policy.namespace,)
        return self.grouping.pick(peer.namespace_selector, self.inputs)

    def _calc_peer_parts(self, key: PeerKey) -> tuple[tuple[str, ...], ...]:
        scope, namespaces, pods, family = key
        grouping = self.grouping
        if namespaces is None:
            picked: tuple[str, ...] = (scope,) if scope is not None else ()
        else:
            picked = grouping.pick(namespaces, self.inputs)
        return tuple(grouping.part(ns, pods, family) for ns in picked)

    def named_port(self, name: str, protocol: str, family: int) -> tuple[str, ...]:
        """``address . protocol . port`` of every Pod that has port ``name`` for
        ``protocol`` (the destination decides: ``evaluate.port_matches``)."""
        key = (name, protocol, family)
        found = self.named.get(key)
        if found is None:
            grouping = self.grouping
            found = self.named[key] = tuple(
                itertools.chain.from_iterable(
                    grouping.named_in(ns).get(key, ()) for ns in sorted(grouping.by_namespace)
                )
            )
        return found


def peer_key(policy: NetworkPolicy, peer: Peer, family: int) -> PeerKey:
    """A selector peer as what it picks: a peer without a namespaceSelector picks in the
    policy's namespace, one with it wherever its selector says."""
    scope = policy.namespace if peer.namespace_selector is None else None
    return scope, peer.namespace_selector, peer.pod_selector, family


@functools.lru_cache(maxsize=1 << 16)
def calc_named_elements(ports: tuple[NamedPort, ...], ips: tuple[str, ...]) -> tuple[str, ...]:
    """One Pod's named-port elements, ``address . protocol . port``, once per distinct ports
    and addresses (every pass asks again for all Pods): their keys, in the same order, are
    ``calc_named_keys``' (a pair per element held ~1.7 MiB at 10,000 Pods)."""
    pod = PodInfo("", "", ips, ports=ports)
    return tuple(
        f"{ip} . {port.protocol.lower()} . {port.port}"
        for port in resolved_ports(ports)
        for f in (4, 6)
        for ip in addresses(pod, f)
    )


@functools.lru_cache(maxsize=1 << 12)
def calc_named_keys(
    ports: tuple[NamedPort, ...], count4: int, count6: int
) -> tuple[NamedKey, ...]:
    """The ``(name, protocol, family)`` of each of ``calc_named_elements``' elements for a Pod
    of ``ports`` with ``count4`` and ``count6`` addresses: one tuple per distinct ports."""
    return tuple(
        named_key(port.name, port.protocol, f)
        for port in resolved_ports(ports)
        for f, count in ((4, count4), (6, count6))
        for _ in range(count)
    )


def resolved_ports(ports: tuple[NamedPort, ...]) -> tuple[NamedPort, ...]:
    """The ports a name resolves to (a name given twice: the first one counts, as in
    ``PodInfo.resolve``)."""
    pod = PodInfo("", "", (), ports=ports)
    return tuple(p for p in ports if pod.resolve(p.name, p.protocol) == p.port)


@functools.lru_cache(maxsize=1 << 12)
def named_key(name: str, protocol: str, family: int) -> NamedKey:
    """One key object per (name, protocol, family), not one per Pod's element."""
    return name, protocol, family


def addresses(pod: PodInfo, family: int) -> tuple[str, ...]:
    """A Pod's ``family`` addresses, canonical (``fd00::0:1`` → ``fd00::1``), prefix cut
    (``PodInfo.families``: parsed once per Pod object)."""
    return pod.families[family == 6]


def to_int(address: str) -> int:
    """An address's integer (``inet_pton``: a tenth of ``ipaddress``' cost)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    return int.from_bytes(socket.inet_pton(family, address), "big")


def to_text(number: int, family: int) -> str:
    return socket.inet_ntop(AF[family], number.to_bytes(4 if family == 4 else 16, "big"))

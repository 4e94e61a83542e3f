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

import functools
import ipaddress
import itertools
import socket
from collections import defaultdict
from collections.abc import Mapping

from netpol.evaluate import NamedPort, PodInfo, PolicyInputs
from netpol.policy import NetworkPolicy, Peer
from netpol.selector import LabelSelector

AF = {4: socket.AF_INET, 6: socket.AF_INET6}
PeerKey = tuple[str | None, LabelSelector | None, LabelSelector | None, int]
NamedKey = tuple[str, str, int]  # port name, protocol, family


class Grouping:
    """The Pods by namespace and what derives from one namespace's Pods, kept from pass to
    pass (``update``: only the namespaces whose Pods changed are computed again)."""

    def __init__(self) -> None:
        self.pods: tuple[PodInfo, ...] | None = None
        self.labels: Mapping[str, Mapping[str, str]] | None = None
        self.by_namespace: dict[str, tuple[PodInfo, ...]] = {}
        self.parts: dict[tuple[str, LabelSelector | None, int], tuple[str, ...]] = {}
        self.named: dict[str, dict[NamedKey, tuple[str, ...]]] = {}
        self.picks: dict[LabelSelector, tuple[str, ...]] = {}

    def update(self, inputs: PolicyInputs) -> None:
        if inputs.pods is not self.pods:
            self.regroup(inputs.pods)
        if inputs.namespaces != self.labels:
            self.picks.clear()
            self.labels = inputs.namespaces

    def regroup(self, pods: tuple[PodInfo, ...]) -> None:
        grouped: dict[str, list[PodInfo]] = defaultdict(list)
        for pod in pods:
            grouped[pod.namespace].append(pod)
        fresh = {ns: tuple(found) for ns, found in grouped.items()}
        changed = {
            ns
            for ns in fresh.keys() | self.by_namespace.keys()
            if not same_pods(fresh.get(ns, ()), self.by_namespace.get(ns, ()))
        }
        if fresh.keys() != self.by_namespace.keys():
            self.picks.clear()  # a namespace selector picks among namespaces with Pods
        self.parts = {k: v for k, v in self.parts.items() if k[0] not in changed}
        for ns in changed:
            self.named.pop(ns, None)
        self.by_namespace, self.pods = fresh, pods

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
        """The ``family`` addresses of the Pods of ``ns`` that ``selector`` picks (None: all)."""
        key = (ns, selector, family)
        found = self.parts.get(key)
        if found is None:
            found = self.parts[key] = tuple(
                ip
                for pod in self.by_namespace.get(ns, ())
                if selector is None or selector.matches(pod.labels)
                for ip in addresses(pod, family)
            )
        return found

    def named_in(self, ns: str) -> dict[NamedKey, tuple[str, ...]]:
        """The named-port elements of the Pods of ``ns``, by (name, protocol, family)."""
        found = self.named.get(ns)
        if found is None:
            named: dict[NamedKey, list[str]] = defaultdict(list)
            for pod in self.by_namespace.get(ns, ()):
                if pod.ports:
                    for key, element in calc_named_elements(pod.ports, pod.ips):
                        named[key].append(element)
            found = self.named[ns] = {k: tuple(v) for k, v in named.items()}
        return found


def same_pods(a: tuple[PodInfo, ...], b: tuple[PodInfo, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


class Members:
    """``grouping``: the one kept from the previous pass (None: computed for these inputs)."""

    def __init__(self, inputs: PolicyInputs, grouping: Grouping | None = None) -> None:
        self.inputs = inputs
        self.grouping = grouping if grouping is not None else Grouping()
        self.grouping.update(inputs)
        self.named: dict[NamedKey, tuple[str, ...]] = {}
        self.peers: dict[PeerKey, tuple[str, ...]] = {}

    def peer_addresses(self, policy: NetworkPolicy, peer: Peer, family: int) -> tuple[str, ...]:
        """The ``family`` addresses of the Pods a selector peer picks (``ipBlock``: none)."""
        if peer.ip_block is not None:
            return ()
        scope = policy.namespace if peer.namespace_selector is None else None
        key = (scope, peer.namespace_selector, peer.pod_selector, family)
        found = self.peers.get(key)
        if found is None:
            found = self.peers[key] = self._calc_peer(key)
        return found

    def _calc_peer(self, key: PeerKey) -> tuple[str, ...]:
        scope, namespaces, pods, family = key
        grouping = self.grouping
        if namespaces is None:
            picked: tuple[str, ...] = (scope,) if scope is not None else ()
        else:
            picked = grouping.pick(namespaces, self.inputs)
        return tuple(
            itertools.chain.from_iterable(grouping.part(ns, pods, family) for ns in picked)
        )

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


@functools.lru_cache(maxsize=1 << 16)
def calc_named_elements(
    ports: tuple[NamedPort, ...], ips: tuple[str, ...]
) -> tuple[tuple[tuple[str, str, int], str], ...]:
    """One Pod's ``(name, protocol, family) -> address . protocol . port`` pairs, once per
    distinct ports and addresses (every pass asks again for all Pods; a name given twice:
    the first one counts, as in ``PodInfo.resolve``)."""
    pod = PodInfo("", "", ips, ports=ports)
    return tuple(
        ((port.name, port.protocol, f), f"{ip} . {port.protocol.lower()} . {port.port}")
        for port in ports
        if pod.resolve(port.name, port.protocol) == port.port
        for f in (4, 6)
        for ip in addresses(pod, f)
    )


def addresses(pod: PodInfo, family: int) -> tuple[str, ...]:
    """A Pod's ``family`` addresses, canonical (``fd00::0:1`` → ``fd00::1``), prefix cut."""
    return split_families(pod.ips)[family]


@functools.lru_cache(maxsize=1 << 16)
def split_families(ips: tuple[str, ...]) -> dict[int, tuple[str, ...]]:
    """Parsed once per distinct address list, not once per peer that asks: ``ipaddress``
    parsing was two thirds of a layout at 1,000 policies × 10,000 Pods (each Pod asked for
    by every peer and named port that looks at its namespace)."""
    parsed = [ipaddress.ip_address(ip.split("/")[0]) for ip in ips]
    return {f: tuple(str(ip) for ip in parsed if ip.version == f) for f in (4, 6)}


def to_int(address: str) -> int:
    """An address's integer (``inet_pton``: a tenth of ``ipaddress``' cost)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    return int.from_bytes(socket.inet_pton(family, address), "big")


def to_text(number: int, family: int) -> str:
    return socket.inet_ntop(AF[family], number.to_bytes(4 if family == 4 else 16, "big"))

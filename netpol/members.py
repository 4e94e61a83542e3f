"""Who a peer picks and where a named port resolves, indexed once per render (pure).

``render.py`` asks for each rule of each policy isolating a local Pod: the addresses of the
Pods a peer's selectors pick, and the (address, protocol, port) where a named port resolves.
Asking ``evaluate.peer_matches`` for every Pod of the cluster per rule cost minutes at 1,000
policies × 10,000 Pods; here the Pods are grouped by namespace, a peer's namespaces are
found by matching the namespaces' labels once, and each canonical peer (its namespace
scope and selectors) and each port name is computed once and shared. The meaning is
``evaluate.peer_matches`` / ``PodInfo.resolve``'s (tests/unit/test_netpol_render.py checks
both against every Pod).
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections import defaultdict

from netpol.evaluate import NamedPort, PodInfo, PolicyInputs
from netpol.policy import NetworkPolicy, Peer
from netpol.selector import LabelSelector

AF = {4: socket.AF_INET, 6: socket.AF_INET6}
PeerKey = tuple[str | None, LabelSelector | None, LabelSelector | None, int]


class Members:
    def __init__(self, inputs: PolicyInputs) -> None:
        self.inputs = inputs
        self.by_namespace: dict[str, list[PodInfo]] = defaultdict(list)
        for pod in inputs.pods:
            self.by_namespace[pod.namespace].append(pod)
        self.named: dict[tuple[str, str, int], tuple[str, ...]] | None = None
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
        if namespaces is None:
            picked = [scope] if scope is not None else []
        else:
            picked = [
                ns
                for ns in self.by_namespace
                if namespaces.matches(self.inputs.namespace_labels(ns))
            ]
        return tuple(
            ip
            for ns in sorted(picked)
            for pod in self.by_namespace.get(ns, ())
            if pods is None or pods.matches(pod.labels)
            for ip in addresses(pod, family)
        )

    def named_port(self, name: str, protocol: str, family: int) -> tuple[str, ...]:
        """``address . protocol . port`` of every Pod that has port ``name`` for
        ``protocol`` (the destination decides: ``evaluate.port_matches``)."""
        if self.named is None:
            named: dict[tuple[str, str, int], list[str]] = defaultdict(list)
            for pod in self.inputs.pods:
                if pod.ports:
                    for key, element in calc_named_elements(pod.ports, pod.ips):
                        named[key].append(element)
            self.named = {k: tuple(v) for k, v in named.items()}
        return self.named.get((name, protocol, family), ())


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

"""The Service proxy's nftables layout (pure): static chains, per-Service data in maps only.

docs/nftables.md describes this table. Cost is map elements: no
Service owns a chain unless it has ClientIP affinity. Chains exist per *shape* (endpoint count
N), shared by every Service of that shape, so 10k Services with 5 endpoints use one chain
``lb-5``::

    nat-prerouting/-output (-100) → services:
      mark 0x4000 if: daddr @service-vips (a ClusterIP) and saddr not @cluster-cidrs;
                      externalIP @external-masq or NodePort @nodeport-masq (Cluster policy)
      daddr . l4proto . dport vmap @service-ips          → goto lb-N | sticky-…
      daddr @nodeport-ips l4proto . dport vmap @service-nodeports → goto np-lb-N | sticky-…
      (before those two: a Pod source (saddr @cluster-cidrs; under detectLocalMode
      BridgeInterface: iifname of the bridge), or the node's own (fib saddr
      type local, marked), reaching a Local-policy external entry goes through
      @sc-service-ips / @sc-service-nodeports → sc-lb-N | sc-np-lb-N | sticky-…, every backend)
    lb-N:      per protocol P: l4proto P → dnat to daddr . l4proto . dport . numgen random mod N
               map @backends-P   (one data map per protocol: nft types a DNAT port by protocol)
    sticky-H:  one chain per ClientIP-affinity Service port (its ClusterIP, externalIP and
               NodePort entries all go to it): per endpoint E of key K, K . saddr @clients →
               refresh, dnat to E; else pick E with probability 1/(N-j) in turn, add K .
               saddr to @clients, dnat to E; if @clients is full, dnat through
               @sticky-backends-P by the chain's key and numgen random mod N (unstuck)
    filter prerouting/output (-110, before DNAT), ct state new: a load balancer IP key in
      @firewall-ips whose key . saddr is not in @firewall-allow (loadBalancerSourceRanges)
      is dropped
    nat-postrouting (100): hairpin (saddr . daddr @hairpin) and marked traffic → masquerade
    filter input/forward/output (0), ct state new: vmap @no-endpoints / @no-endpoint-nodeports
      (goto reject-chain = no endpoints | drop = Local policy, none local), VIP with an unknown
      port → reject, unallocated address of a service CIDR → drop. reject-chain answers TCP
      with a reset: an ICMPv6 unreachable arriving while connect() holds the socket is only
      a soft error, so an empty IPv6 Service was refused a SYN retransmit (1 s) later.

ClientIP affinity is kept per Service port, as Kubernetes keys it: a client stuck to an
endpoint through the ClusterIP reaches the same endpoint through the NodePort or an externalIP.
Every affinity port has a chain; every (port, endpoint) a 32-bit key, and one dynamic set per
table, ``clients``, holds ``key . client address``. nft 1.0.6 takes no constant on the left of
a lookup, but ``numgen random mod 1 offset K`` is always K, a typed expression nft also reads
back, so the key is written as that. kube-proxy keeps a set per endpoint; the kernel finds a
set by walking the table's list of sets by name, once per rule that names it, and 2,500 such
sets (10,000 Services, 5% with affinity) cost ~0.5 s of a full sync. Two endpoints whose keys
collide only share entries: a client then sticks to a serving endpoint of the port it asked
for, since each rule looks up its own endpoint's key alone. A Local policy's entries go to a
twin chain over the local endpoints, with the same keys.
The backends maps need ``typeof`` (numgen's key type) and so protocol-typed data: ``ip daddr .
tcp dport`` makes nft add ``meta l4proto tcp`` to the dnat rule, and ``th dport`` data cannot be
read back by a later transaction; hence ``backends-tcp|udp|sctp``.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable
from typing import NamedTuple

from kernel.nftelem import VERDICT, SetType
from services.proxy.model import PROTOCOLS, NodeView

TABLE = "pycni-svc"
FAMILY = {4: "ip", 6: "ip6"}
ADDR = {4: "ipv4_addr", 6: "ipv6_addr"}
MASQ_MARK = "0x4000"
# Entry kinds: a ClusterIP/externalIP key (vip), a NodePort key (np), and their short-circuit
# twins (sc-vip, sc-np): the same keys dispatched for clients in the cluster (Pods, the node)
# of a Local-policy external entry, over every backend rather than this node's.
KEY = {
    "vip": "{f} daddr . meta l4proto . th dport",
    "np": "meta l4proto . th dport",
    "sc-vip": "{f} daddr . meta l4proto . th dport",
    "sc-np": "meta l4proto . th dport",
}
KEY_TYPE = {
    "vip": "{a} . inet_proto . inet_service",
    "np": "inet_proto . inet_service",
    "sc-vip": "{a} . inet_proto . inet_service",
    "sc-np": "inet_proto . inet_service",
}
PREFIX = {"vip": "", "np": "np-", "sc-vip": "sc-", "sc-np": "sc-np-"}
CLIENT = "{f} saddr . {f} daddr . meta l4proto . th dport"


class Element(NamedTuple):
    """One element of a named set or map, in nft syntax; ``value`` None for a set. A tuple:
    a full render makes ~70k of them, hashed, counted and sorted."""

    name: str
    key: str
    value: str | None = None

    def render(self) -> str:
        return self.key if self.value is None else f"{self.key} : {self.value}"


class Shape(NamedTuple):
    """A chain kind shared by every entry of that shape: kind lb, entry vip|np, N (a tuple:
    one per entry of a full render, counted per Service)."""

    entry: str
    kind: str
    size: int  # N: backends, one dispatch index each (a field "count" would hide tuple.count)
    timeout: int = 0

    @property
    def chain(self) -> str:
        return f"{PREFIX[self.entry]}lb-{self.size}"


class AffinityChain(NamedTuple):
    """The chain of one ClientIP-affinity Service port (or of its Local-policy twin): every
    entry of the port goes to it, and ``clients`` holds each endpoint's key with the clients
    stuck to that endpoint. Counted with the shapes, but one Service's own."""

    chain: str
    proto: str
    timeout: int
    backends: tuple[tuple[str, int, int], ...]  # (address text, port, its key in @clients)
    key: int = 0  # 64 bits: its endpoints' key prefix in @sticky-backends-P (calc_chain_key)

    @property
    def key_text(self) -> str:
        """The chain's key as the two 32-bit fields of a ``sticky-backends`` key."""
        return f"{self.key >> 32} . {self.key & 0xFFFFFFFF}"


AnyShape = Shape | AffinityChain
# pick-T-i, aff-T-N: the per-index affinity chains of an earlier layout (a restart deletes them)
SHAPE_CHAIN = re.compile(r"^(sc-)?(np-)?(lb|aff-\d+|pick-\d+)-\d+$|^sticky-[A-Z2-7]{10}(-|$)")
#: an earlier layout's set per affinity endpoint (a restart's full render deletes them)
CLIENTS_SET = re.compile(r"^clients-[A-Z2-7]{10}$")
CLIENTS = "clients"
#: the most clients ``clients`` holds, every affinity port's together (a dynamic set's
#: default is 65,535; kube-proxy has that per endpoint): past it, a new client is balanced
#: without being stuck (``_sticky_rules``)
CLIENTS_SIZE = 1_048_576


def is_shape_chain(name: str) -> bool:
    """A chain of a shape (``lb-N``, its ``np-``, ``sc-`` and ``sc-np-`` twins) or of an
    affinity port (``sticky-…``), or
    a per-index affinity chain an earlier layout left (``aff-T-N``, ``pick-T-i``)."""
    return bool(SHAPE_CHAIN.match(name))


def is_affinity_set(name: str) -> bool:
    """A ``clients-`` set of an earlier layout's affinity endpoint."""
    return bool(CLIENTS_SET.match(name))


def calc_shape_chains(shapes: Iterable[AnyShape]) -> set[str]:
    """The chains a set of shapes uses."""
    return {shape.chain for shape in shapes}


def _hash(text: str) -> str:
    return base64.b32encode(_digest(text)).decode()[:10]


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


READABLE = re.compile(r"^[a-z0-9][-a-z0-9.]*$")


def calc_affinity_chain_name(namespace: str, name: str, proto: str, port: int, local: bool) -> str:
    """``sticky-<hash>-ns/name/proto/port`` (``sticky-<hash>`` alone when a hand-written
    record's names are not DNS labels: nft would refuse them); ``local``: the twin over the
    local endpoints a Local policy's entries use."""
    ref = f"{namespace}/{name}/{proto}/{port}" + ("/local" if local else "")
    readable = READABLE.match(namespace) and READABLE.match(name)
    return f"sticky-{_hash(ref)}" + (f"-{ref}" if readable else "")


def calc_clients_key(
    namespace: str, name: str, proto: str, port: int, address: str, target: int
) -> int:
    """The key in ``clients`` of one endpoint of one Service port: made of both, so it is the
    same across restarts and resyncs, whatever else changes."""
    return int.from_bytes(_digest(f"{namespace}/{name}/{proto}/{port}/{address}/{target}")[:4])


def calc_chain_key(chain: str) -> int:
    """An affinity chain's key in ``sticky-backends-P``: 64 bits of its name's digest (an
    accidental collision among a node's chains is ~1e-13; a made one leaves the second
    Service out, as a taken VIP does: ``table._map_keys``)."""
    return int.from_bytes(_digest(chain)[:8])


def sticky_backends_map(proto: str) -> str:
    """The map of every affinity chain's endpoints by (chain key, index), of one protocol:
    the picks a client past the ``clients`` set's size takes."""
    return f"sticky-backends-{proto}"


def pick_chain(entry: str, timeout: int, i: int) -> str:
    return f"{PREFIX[entry]}pick-{timeout}-{i}"


PICK_CHAIN = re.compile(r"^((?:sc-)?(?:np-)?)pick-\d+-(\d+)$")


def calc_index_objects(chains: Iterable[str]) -> set[str]:
    """The objects an earlier layout's affinity pick chains among ``chains`` used
    (``{np-}slot-i`` maps, ``sticky-i`` sets): a restart deletes them with their chains."""
    objects = set()
    for chain in chains:
        if match := PICK_CHAIN.match(chain):
            prefix, i = match.group(1) or "", match.group(2)
            objects |= {f"{prefix}slot-{i}", f"sticky-{i}"}
    return objects


def render_skeleton(family: int, node: NodeView | None = None) -> str:
    """The static objects (idempotent ``add``) and the rules of the static chains (``node``:
    how its proxy tells local traffic and whether it masquerades all of it)."""
    t, f, a = f"{FAMILY[family]} {TABLE}", FAMILY[family], ADDR[family]
    lines = [f'add table {t} {{ comment "pycni Service proxy"; }}']
    lines += [f"add set {t} {name} {{ {spec} }}" for name, spec in _static_sets(f, a)]
    lines += [f"add map {t} {name} {{ {spec} }}" for name, spec in _static_maps(f, a)]
    for chain, hook in BASE_CHAINS:
        lines.append(f"add chain {t} {chain} {{ {hook}; policy accept; }}")
    for chain in HELPER_CHAINS:
        lines.append(f"add chain {t} {chain}")
    for chain, rules in _static_rules(f, node).items():
        lines.append(f"flush chain {t} {chain}")
        lines += [f"add rule {t} {chain} {rule}" for rule in rules]
    return "\n".join(lines) + "\n"


BASE_CHAINS = (
    ("nat-prerouting", "type nat hook prerouting priority -100"),
    ("nat-output", "type nat hook output priority -100"),
    ("nat-postrouting", "type nat hook postrouting priority 100"),
    ("filter-input", "type filter hook input priority 0"),
    ("filter-forward", "type filter hook forward priority 0"),
    ("filter-output", "type filter hook output priority 0"),
    ("filter-prerouting-pre-dnat", "type filter hook prerouting priority -110"),
    ("filter-output-pre-dnat", "type filter hook output priority -110"),
)
HELPER_CHAINS = ("services", "endpoints-check", "reject-chain", "firewall-check")
DATA_SETS = (
    "cluster-cidrs",
    "service-cidrs",
    "nodeport-ips",
    "service-vips",
    "external-masq",
    "nodeport-masq",
    "hairpin",
    "firewall-ips",
    "firewall-allow",
)


def backends_map(entry: str, proto: str) -> str:
    """The backends map of one entry kind (vip|np) and protocol."""
    return f"{PREFIX[entry]}backends-{proto}"


BACKENDS_MAPS = tuple(backends_map(entry, proto) for entry in PREFIX for proto in PROTOCOLS)
STICKY_MAPS = tuple(sticky_backends_map(proto) for proto in PROTOCOLS)
DATA_MAPS = (
    "service-ips",
    "service-nodeports",
    "sc-service-ips",
    "sc-service-nodeports",
    *BACKENDS_MAPS,
    *STICKY_MAPS,
    "no-endpoints",
    "no-endpoint-nodeports",
)


def _static_sets(f: str, a: str) -> list[tuple[str, str]]:
    """``clients`` first: every affinity rule names it, and the kernel finds a set by name
    walking the table's sets in the order they were made. It is never flushed: a resync
    keeps clients' affinity."""
    vip = KEY_TYPE["vip"].format(a=a)
    clients = (
        f"typeof numgen random mod 1 . {f} saddr; flags dynamic,timeout; size {CLIENTS_SIZE};"
    )
    return [
        (CLIENTS, clients),
        ("cluster-cidrs", f"type {a}; flags interval;"),
        ("service-cidrs", f"type {a}; flags interval;"),
        ("nodeport-ips", f"type {a};"),
        ("service-vips", f"type {a};"),
        ("external-masq", f"type {vip};"),
        ("nodeport-masq", f"type {KEY_TYPE['np']};"),
        ("hairpin", f"type {a} . {a};"),
        ("firewall-ips", f"type {vip};"),
        ("firewall-allow", f"type {vip} . {a}; flags interval;"),
    ]


def _static_maps(f: str, a: str) -> list[tuple[str, str]]:
    vip, np = KEY_TYPE["vip"].format(a=a), KEY_TYPE["np"]
    return [
        ("service-ips", f"type {vip} : verdict;"),
        ("service-nodeports", f"type {np} : verdict;"),
        ("sc-service-ips", f"type {vip} : verdict;"),
        ("sc-service-nodeports", f"type {np} : verdict;"),
        *_backends_maps(f),
        *[
            (sticky_backends_map(proto), f"typeof {STICKY_KEY} : {f} daddr . {proto} dport;")
            for proto in PROTOCOLS
        ],
        ("no-endpoints", f"type {vip} : verdict;"),
        ("no-endpoint-nodeports", f"type {np} : verdict;"),
    ]


#: a ``sticky-backends`` key: the chain's key (two 32-bit fields) and the endpoint's index
STICKY_KEY = "numgen random mod 1 . numgen random mod 1 . numgen random mod 1"


def _backends_maps(f: str) -> list[tuple[str, str]]:
    """Data ``daddr . P dport``: not ``th dport``, which nft 1.0.6 cannot read back."""
    return [
        (
            backends_map(entry, proto),
            f"typeof {KEY[entry].format(f=f)} . numgen random mod 1 : {f} daddr . {proto} dport;",
        )
        for entry in PREFIX
        for proto in PROTOCOLS
    ]


def calc_element_types(family: int) -> dict[str, SetType]:
    """The datatypes of the sets and maps whose elements kernel/nftelem.py can write (the
    interval sets are left to nft: it splits and merges their ranges), as declared above;
    tests/netns/test_svc_elements.py checks them against nft's own listing."""
    a = ADDR[family]
    key = {"vip": (a, "inet_proto", "inet_service"), "np": ("inet_proto", "inet_service")}
    key |= {"sc-vip": key["vip"], "sc-np": key["np"]}
    types = {
        "nodeport-ips": SetType((a,)),
        "service-vips": SetType((a,)),
        "external-masq": SetType(key["vip"]),
        "nodeport-masq": SetType(key["np"]),
        "hairpin": SetType((a, a)),
        "firewall-ips": SetType(key["vip"]),
        "service-ips": SetType(key["vip"], VERDICT),
        "service-nodeports": SetType(key["np"], VERDICT),
        "sc-service-ips": SetType(key["vip"], VERDICT),
        "sc-service-nodeports": SetType(key["np"], VERDICT),
        "no-endpoints": SetType(key["vip"], VERDICT),
        "no-endpoint-nodeports": SetType(key["np"], VERDICT),
    }
    for entry in PREFIX:  # numgen's index: an integer in host order
        backends = SetType((*key[entry], "host_u32"), (a, "inet_service"))
        types |= {backends_map(entry, proto): backends for proto in PROTOCOLS}
    sticky = SetType(("host_u32",) * 3, (a, "inet_service"))
    return types | {name: sticky for name in STICKY_MAPS}


def calc_local(f: str, node: NodeView | None, local: bool = True) -> str:
    """The match of traffic from the cluster's Pods (``local``) or not from them, as the
    node's ``detectLocalMode`` tells it: by the bridge a packet came in on, or by its source
    address in the cluster CIDRs."""
    if node is not None and node.local_bridge is not None:
        return f'iifname {"" if local else "!= "}"{node.local_bridge}*"'
    return f"{f} saddr {'' if local else '!= '}@cluster-cidrs"


def calc_not_local(f: str, node: NodeView | None) -> str:
    """The match of traffic a ClusterIP masquerades: not from the cluster's Pods, or any
    traffic under masqueradeAll."""
    if node is not None and node.masquerade_all:
        return ""
    return calc_local(f, node, local=False) + " "


def _static_rules(f: str, node: NodeView | None = None) -> dict[str, list[str]]:
    vip, np, mark = KEY["vip"].format(f=f), KEY["np"], f"meta mark set meta mark | {MASQ_MARK}"
    nodeport = f"{f} daddr @nodeport-ips"
    pods, host = calc_local(f, node), "fib saddr type local"
    return {
        "nat-prerouting": ["jump services"],
        "nat-output": ["jump services"],
        "services": [
            f"{f} daddr @service-vips {calc_not_local(f, node)}{mark}",
            f"{vip} @external-masq {mark}",
            f"{nodeport} {np} @nodeport-masq {mark}",
            f"{pods} {vip} vmap @sc-service-ips",
            f"{pods} {nodeport} {np} vmap @sc-service-nodeports",
            f"{host} {vip} @sc-service-ips {mark} {vip} vmap @sc-service-ips",
            f"{host} {nodeport} {np} @sc-service-nodeports {mark} {np} vmap @sc-service-nodeports",
            f"{vip} vmap @service-ips",
            f"{nodeport} {np} vmap @service-nodeports",
        ],
        "nat-postrouting": [
            f"ct status dnat {f} saddr . {f} daddr @hairpin masquerade",
            f"meta mark & {MASQ_MARK} == 0 return",
            f"meta mark set meta mark ^ {MASQ_MARK}",
            "masquerade fully-random",
        ],
        "endpoints-check": [
            f"{vip} vmap @no-endpoints",
            f"{nodeport} {np} vmap @no-endpoint-nodeports",
            f"{f} daddr @service-vips goto reject-chain",
            f"{f} daddr @service-cidrs drop",
        ],
        "reject-chain": ["meta l4proto tcp reject with tcp reset", "reject"],
        "filter-input": ["ct state new jump endpoints-check"],
        "filter-forward": ["ct state new jump endpoints-check"],
        "filter-output": ["ct state new jump endpoints-check"],
        "filter-prerouting-pre-dnat": ["ct state new jump firewall-check"],
        "filter-output-pre-dnat": ["ct state new jump firewall-check"],
        "firewall-check": [f"{vip} @firewall-ips {vip} . {f} saddr != @firewall-allow drop"],
    }


def render_shape(family: int, shape: AnyShape) -> str:
    """A shape's chain (created once, shared by every entry of that shape), or an affinity
    port's chain."""
    t, f = f"{FAMILY[family]} {TABLE}", FAMILY[family]
    if isinstance(shape, AffinityChain):
        return _render_chain(t, shape.chain, _sticky_rules(f, shape))
    return _render_chain(t, shape.chain, _lb_rules(f, shape))


def _render_chain(t: str, chain: str, rules: list[str]) -> str:
    lines = [f"add chain {t} {chain}", f"flush chain {t} {chain}"]
    return "\n".join(lines + [f"add rule {t} {chain} {rule}" for rule in rules]) + "\n"


def _lb_rules(f: str, shape: Shape) -> list[str]:
    """One guarded rule per protocol: each protocol's packets read that protocol's map."""
    key, n = KEY[shape.entry].format(f=f), shape.size
    return [
        f"meta l4proto {proto} dnat {f} to {key} . numgen random mod {n} "
        f"map @{backends_map(shape.entry, proto)}"
        for proto in PROTOCOLS
    ]


def _sticky_rules(f: str, shape: AffinityChain) -> list[str]:
    """A known client refreshes its entry and goes to its endpoint; a new one picks endpoint
    j with probability 1/(N-j) in turn (uniform, without a per-chain anonymous map) and is
    added to ``clients`` under that endpoint's key. An ``update`` that cannot add (the set
    holds ``CLIENTS_SIZE``) ends its rule unmatched: the last rule then picks among the
    chain's endpoints in ``sticky-backends-P`` (``calc_sticky_elements``), so a client past
    the set's size is balanced, not stuck, rather than left without DNAT. One rule, not a
    second cascade: 500 affinity ports' cascades were 2,000 more rules, ~0.06 s of a 10k
    full sync's declarations."""
    n = len(shape.backends)
    out, picks = [], []
    for j, (address, port, key) in enumerate(shape.backends):
        host = f"[{address}]" if f == "ip6" else address
        client = f"numgen random mod 1 offset {key} . {f} saddr"
        dnat = f"meta l4proto {shape.proto} dnat {f} to {host}:{port}"
        then = f"update @{CLIENTS} {{ {client} timeout {shape.timeout}s }} {dnat}"
        pick = f"numgen random mod {n - j} 0 " if n - j > 1 else ""
        out.append(f"{client} @{CLIENTS} {then}")
        picks.append(pick + then)
    high, low = shape.key >> 32, shape.key & 0xFFFFFFFF
    unstuck = (
        f"meta l4proto {shape.proto} dnat {f} to numgen random mod 1 offset {high} . "
        f"numgen random mod 1 offset {low} . numgen random mod {n} "
        f"map @{sticky_backends_map(shape.proto)}"
    )
    return [*out, *picks, unstuck]


def calc_sticky_elements(shape: AffinityChain) -> list[Element]:
    """An affinity chain's endpoints in ``sticky-backends-P``, by (its key, index)."""
    name, key = sticky_backends_map(shape.proto), shape.key_text
    return [
        Element(name, f"{key} . {j}", f"{address} . {port}")
        for j, (address, port, _) in enumerate(shape.backends)
    ]

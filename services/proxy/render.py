"""The Service proxy's nftables layout (pure): static chains, per-Service data in maps only.

docs/nftables.md describes this table. Cost is map elements: no
Service owns a chain. Chains exist per *shape* (endpoint count N, affinity timeout T), shared by
every Service of that shape, so 10k Services with 5 endpoints use one chain ``lb-5``::

    nat-prerouting/-output (-100) → services:
      mark 0x4000 if: daddr @service-vips (a ClusterIP) and saddr not @cluster-cidrs;
                      externalIP @external-masq or NodePort @nodeport-masq (Cluster policy)
      daddr . l4proto . dport vmap @service-ips          → goto lb-N | aff-T-N
      daddr @nodeport-ips l4proto . dport vmap @service-nodeports → goto np-lb-N | np-aff-T-N
      (before those two: a Pod source (saddr @cluster-cidrs), or the node's own (fib saddr
      type local, marked), reaching a Local-policy external entry goes through
      @sc-service-ips / @sc-service-nodeports → sc-lb-N | sc-np-lb-N, every backend)
    lb-N:      per protocol P: l4proto P → dnat to daddr . l4proto . dport . numgen random mod N
               map @backends-P   (one data map per protocol: nft types a DNAT port by protocol)
    aff-T-N:   for i < N: saddr . daddr . l4proto . dport @sticky-i → refresh, dnat map @slot-i
               numgen random mod N vmap { i : goto pick-T-i }   (pick: update @sticky-i, dnat)
    filter prerouting/output (-110, before DNAT), ct state new: a load balancer IP key in
      @firewall-ips whose key . saddr is not in @firewall-allow (loadBalancerSourceRanges)
      is dropped
    nat-postrouting (100): hairpin (saddr . daddr @hairpin) and marked traffic → masquerade
    filter input/forward/output (0), ct state new: vmap @no-endpoints / @no-endpoint-nodeports
      (goto reject-chain = no endpoints | drop = Local policy, none local), VIP with an unknown
      port → reject, unallocated address of a service CIDR → drop. reject-chain answers TCP
      with a reset: an ICMPv6 unreachable arriving while connect() holds the socket is only
      a soft error, so an empty IPv6 Service was refused a SYN retransmit (1 s) later.

A lookup miss breaks a rule, so an affinity entry whose slot is gone falls through to a fresh
choice. nft 1.0.6 has no constant in a concatenation nor verdict data in a dynamic map, hence
the per-index ``sticky-i``/``slot-i`` objects (bounded by the largest affinity Service).
The backends maps need ``typeof`` (numgen's key type) and so protocol-typed data: ``ip daddr .
tcp dport`` makes nft add ``meta l4proto tcp`` to the dnat rule, and ``th dport`` data cannot be
read back by a later transaction; hence ``backends-tcp|udp|sctp``. The ``slot-i`` maps are
plain ``type`` maps, whose ``inet_service`` data carries no protocol: one serves all three.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

from services.proxy.model import PROTOCOLS

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
    """A chain kind shared by every entry of that shape: kind lb|aff, entry vip|np, N, T
    (a tuple: one per entry of a full render, counted per Service)."""

    entry: str
    kind: str
    size: int  # N: backends, one dispatch index each (a field "count" would hide tuple.count)
    timeout: int = 0

    @property
    def chain(self) -> str:
        middle = "lb" if self.kind == "lb" else f"aff-{self.timeout}"
        return f"{PREFIX[self.entry]}{middle}-{self.size}"


SHAPE_CHAIN = re.compile(r"^(sc-)?(np-)?(lb|aff-\d+|pick-\d+)-\d+$")


def is_shape_chain(name: str) -> bool:
    """A chain of a shape (``lb-N``, ``aff-T-N``, ``pick-T-i``, their ``np-``, ``sc-`` and
    ``sc-np-`` twins)."""
    return bool(SHAPE_CHAIN.match(name))


def calc_shape_chains(shapes: Iterable[Shape]) -> set[str]:
    """The chains a set of shapes uses: its own, and for affinity the pick chain per index
    (``pick-T-i`` is shared by every affinity shape of timeout T with more than i slots)."""
    chains = set()
    for shape in shapes:
        chains.add(shape.chain)
        if shape.kind == "aff":
            chains |= {pick_chain(shape.entry, shape.timeout, i) for i in range(shape.size)}
    return chains


def pick_chain(entry: str, timeout: int, i: int) -> str:
    return f"{PREFIX[entry]}pick-{timeout}-{i}"


PICK_CHAIN = re.compile(r"^((?:sc-)?(?:np-)?)pick-\d+-(\d+)$")


def calc_index_objects(chains: Iterable[str]) -> set[str]:
    """The affinity index objects the pick chains among ``chains`` use: ``{np-}slot-i`` and
    ``sticky-i`` (one sticky set per index serves ClusterIPs and NodePorts)."""
    objects = set()
    for chain in chains:
        if match := PICK_CHAIN.match(chain):
            prefix, i = match.group(1) or "", match.group(2)
            objects |= {f"{prefix}slot-{i}", f"sticky-{i}"}
    return objects


def render_skeleton(family: int) -> str:
    """The static objects (idempotent ``add``) and the rules of the static chains."""
    t, f, a = f"{FAMILY[family]} {TABLE}", FAMILY[family], ADDR[family]
    lines = [f'add table {t} {{ comment "pycni Service proxy"; }}']
    lines += [f"add set {t} {name} {{ {spec} }}" for name, spec in _static_sets(a)]
    lines += [f"add map {t} {name} {{ {spec} }}" for name, spec in _static_maps(f, a)]
    for chain, hook in BASE_CHAINS:
        lines.append(f"add chain {t} {chain} {{ {hook}; policy accept; }}")
    for chain in HELPER_CHAINS:
        lines.append(f"add chain {t} {chain}")
    for chain, rules in _static_rules(f).items():
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
DATA_MAPS = (
    "service-ips",
    "service-nodeports",
    "sc-service-ips",
    "sc-service-nodeports",
    *BACKENDS_MAPS,
    "no-endpoints",
    "no-endpoint-nodeports",
)


def _static_sets(a: str) -> list[tuple[str, str]]:
    vip = KEY_TYPE["vip"].format(a=a)
    return [
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
        ("no-endpoints", f"type {vip} : verdict;"),
        ("no-endpoint-nodeports", f"type {np} : verdict;"),
    ]


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


def _static_rules(f: str) -> dict[str, list[str]]:
    vip, np, mark = KEY["vip"].format(f=f), KEY["np"], f"meta mark set meta mark | {MASQ_MARK}"
    nodeport = f"{f} daddr @nodeport-ips"
    pods, host = f"{f} saddr @cluster-cidrs", "fib saddr type local"
    return {
        "nat-prerouting": ["jump services"],
        "nat-output": ["jump services"],
        "services": [
            f"{f} daddr @service-vips {f} saddr != @cluster-cidrs {mark}",
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


def render_shape(family: int, shape: Shape) -> str:
    """A shape's objects and chain(s): created once, shared by every entry of that shape."""
    t, f = f"{FAMILY[family]} {TABLE}", FAMILY[family]
    if shape.kind == "lb":
        return _render_chain(t, shape.chain, _lb_rules(f, shape))
    lines = [
        _render_affinity_index(family, shape.entry, i, shape.timeout) for i in range(shape.size)
    ]
    return "".join(lines) + _render_chain(t, shape.chain, _affinity_rules(f, shape))


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


def _affinity_rules(f: str, shape: Shape) -> list[str]:
    key, client, p = KEY[shape.entry].format(f=f), CLIENT.format(f=f), PREFIX[shape.entry]
    sticky = [
        f"{client} @sticky-{i} update @sticky-{i} {{ {client} timeout {shape.timeout}s }} "
        f"dnat {f} to {key} map @{p}slot-{i}"
        for i in range(shape.size)
    ]
    picks = ", ".join(
        f"{i} : goto {pick_chain(shape.entry, shape.timeout, i)}" for i in range(shape.size)
    )
    return sticky + [f"numgen random mod {shape.size} vmap {{ {picks} }}"]


def _render_affinity_index(family: int, entry: str, i: int, timeout: int) -> str:
    """Objects of backend index ``i``: the sticky set, the slot map, the pick chain."""
    t, f, a, p = f"{FAMILY[family]} {TABLE}", FAMILY[family], ADDR[family], PREFIX[entry]
    client = CLIENT.format(f=f)
    key_type, dest = KEY_TYPE[entry].format(a=a), f"{a} . inet_service"
    lines = [
        f"add set {t} sticky-{i} {{ type {a} . {a} . inet_proto . inet_service; "
        "flags dynamic,timeout; }",
        f"add map {t} {p}slot-{i} {{ type {key_type} : {dest}; }}",
    ]
    rules = [
        f"update @sticky-{i} {{ {client} timeout {timeout}s }}",
        f"dnat {f} to {KEY[entry].format(f=f)} map @{p}slot-{i}",
    ]
    return "\n".join(lines) + "\n" + _render_chain(t, pick_chain(entry, timeout, i), rules)

"""Rendering pycni-bridge's masquerade table (pure): static chains, per-attachment data in sets.

knftables style: the table, its sets and its one chain are static; an attachment only adds
and removes set elements, each carrying the attachment tag as its comment, so DEL and GC find
them with no prevResult and no pod netns:

    table inet pycni-masq {
      set masq4   { type ifname . ipv4_addr; }                 # bridge . pod address
      set nomasq4 { type ifname . ipv4_addr . ipv4_addr; flags interval; }  # ... . own subnet
      set cluster4 { type ipv4_addr; flags interval; }       # the cluster's pools (overlay)
      (masq6 / nomasq6 / cluster6 alike)
      chain postrouting {
        type nat hook postrouting priority srcnat; policy accept;
        iifname . ip saddr . ip daddr @nomasq4 return          # inside its own subnet
        ip daddr @cluster4 return                              # to a Pod of another pool
        iifname . ip saddr @masq4 ip daddr != 224.0.0.0/4 masquerade  # leaving it, not multicast
      }
    }

Same behaviour as the reference per-container chain (`-d <subnet> ACCEPT`, `! -d 224.0.0.0/4
MASQUERADE`). Keys carry the bridge (routed pod traffic enters the node through it, so it is
``iifname`` in postrouting): two networks with the same subnet on different bridges are
different traffic with different elements. Reading back uses `nft -j` JSON only
(``parse_elements``). The first layout keyed by the address alone (``LEGACY``) is recognised
and rewritten (``render_migration``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cni.spec.errors import InvalidConfig
from kernel.nftelem import ElementBatch, ElementChange, SetType

FAMILY = "inet"
TABLE = "pycni-masq"
CHAIN = "postrouting"
MULTICAST = {4: "224.0.0.0/4", 6: "ff00::/8"}
ADDR_TYPE = {4: "ipv4_addr", 6: "ipv6_addr"}
MATCH = {4: "ip", 6: "ip6"}
SETS = ("masq4", "nomasq4", "masq6", "nomasq6")
SET_TYPES = {
    f"{kind}{v}": ["ifname", ADDR_TYPE[v]] + ([ADDR_TYPE[v]] if kind == "nomasq" else [])
    for v in (4, 6)
    for kind in ("masq", "nomasq")
}
CLUSTER_SETS = {4: "cluster4", 6: "cluster6"}  # the cluster's pools (the overlay keeps them)
NOT_IN_NFT_STRING = set('"\\*')  # nft has no escapes in a quoted string; '*' is a wildcard


@dataclass(frozen=True)
class Element:
    """One set element: ``key`` in nft syntax, ``tag`` (its comment) not part of identity."""

    set: str
    key: str
    tag: str | None = field(default=None, compare=False)


def render_table() -> str:
    """The static part, idempotent: (re)creates the table, sets and chain, rewrites the rules."""
    t = f"{FAMILY} {TABLE}"
    lines = [
        f'add table {t} {{ comment "pycni-bridge ipMasq"; }}',
        f"add chain {t} {CHAIN} {{ type nat hook postrouting priority srcnat; policy accept; }}",
    ]
    for name, types in SET_TYPES.items():
        flags = " flags interval;" if name.startswith("nomasq") else ""
        lines.append(f"add set {t} {name} {{ type {' . '.join(types)};{flags} }}")
    for v, name in CLUSTER_SETS.items():
        lines.append(f"add set {t} {name} {{ type {ADDR_TYPE[v]}; flags interval; auto-merge; }}")
    lines.append(f"flush chain {t} {CHAIN}")
    for v in (4, 6):
        m = MATCH[v]
        lines.append(f"add rule {t} {CHAIN} iifname . {m} saddr . {m} daddr @nomasq{v} return")
    for v, name in CLUSTER_SETS.items():
        lines.append(f"add rule {t} {CHAIN} {MATCH[v]} daddr @{name} return")
    for v in (4, 6):
        m = MATCH[v]
        lines.append(
            f"add rule {t} {CHAIN} iifname . {m} saddr @masq{v} "
            f"{m} daddr != {MULTICAST[v]} masquerade"
        )
    return "\n".join(lines) + "\n"


def render_cluster(cidrs: Iterable[str]) -> str:
    """The table with the cluster's pools as its no-masquerade destinations, replaced whole."""
    nets = [ipaddress.ip_network(c) for c in cidrs]
    script = render_table()
    for v, name in CLUSTER_SETS.items():
        script += f"flush set {FAMILY} {TABLE} {name}\n"
        members = sorted(str(n) for n in nets if n.version == v)
        if members:
            script += f"add element {FAMILY} {TABLE} {name} {{ {', '.join(members)} }}\n"
    return script


def render_migration(elements: Iterable[Element]) -> str:
    """One transaction replacing a table of another layout by this one with ``elements``."""
    return f"delete table {FAMILY} {TABLE}\n" + render_table() + render_add(elements)


def is_legacy(doc: dict) -> bool:
    """Whether a `nft -j list table` document has our sets in another layout (types)."""
    return any(_set_types(found) != SET_TYPES[found["name"]] for found in _our_sets(doc))


def _set_types(found: dict) -> list[str]:
    types = found.get("type", [])
    return [types] if isinstance(types, str) else list(types)


def ifname_literal(name: str) -> str:
    """An interface name as an nft string literal; InvalidConfig when nft cannot express it."""
    if not nft_expressible(name):
        raise InvalidConfig(
            "invalid key 'bridge'",
            f"{name!r} cannot be matched by nftables (ipMasq): no '\"', '\\', "
            "'*' or control characters",
        )
    return f'"{name}"'


def nft_expressible(name: str) -> bool:
    return bool(name) and not NOT_IN_NFT_STRING & set(name) and name.isprintable()


def canon_network(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
    """How nft prints a prefix: a full-length one as a bare address."""
    if network.prefixlen == network.max_prefixlen:
        return str(network.network_address)
    return str(network)


def elements_for(tag: str, bridge: str, pairs: Iterable[tuple[Any, Any]]) -> list[Element]:
    """The elements of one attachment on ``bridge``: for each (pod address, own subnet) one
    masq and one nomasq element."""
    out = []
    port = ifname_literal(bridge)
    for address, subnet in pairs:
        v = address.version
        out.append(Element(f"masq{v}", f"{port} . {address}", tag))
        out.append(Element(f"nomasq{v}", f"{port} . {address} . {canon_network(subnet)}", tag))
    return out


def migrate_elements(legacy: Iterable[Element], bridges: dict[str, str]) -> list[Element]:
    """Legacy (address-keyed) elements rekeyed by the bridge of their attachment (tag ->
    bridge); elements of an attachment without one are left out."""
    out = []
    for elem in legacy:
        bridge = bridges.get(elem.tag or "")
        if bridge and nft_expressible(bridge):
            out.append(Element(elem.set, f"{ifname_literal(bridge)} . {elem.key}", elem.tag))
    return out


def describe_key(key: str) -> str:
    """An element's key in words: '10.22.0.2 on bridge pycni0'."""
    port, address = key.split(" . ")[:2]
    return f"{address} on bridge {port.strip(chr(34))}"


def calc_element_batch(deletes: Iterable[Element], adds: Iterable[Element]) -> ElementBatch:
    """``render_delete(deletes) + render_add(adds)`` as one netlink batch (``Nft.run_elements``):
    no libnftables cache refill, which beside the Service proxy's 2,500 affinity sets cost
    each attachment's ADD 4.5 ms and its DEL 5.2 ms (0.2-0.4 ms alone)."""
    changes = []
    ordered = sorted(deletes, key=lambda e: (e.set, e.key))
    for verb, elements in (("delete", ordered), ("add", list(adds))):
        by_set: dict[str, list[Element]] = {}
        for elem in elements:
            by_set.setdefault(elem.set, []).append(elem)
        for name, found in by_set.items():
            set_type = SetType(tuple(SET_TYPES[name]), None, name.startswith("nomasq"))
            keys = tuple((e.key, None) for e in found)
            comments = tuple(e.tag or "" for e in found) if verb == "add" else ()
            changes.append(ElementChange(verb, name, set_type, keys, comments))
    return ElementBatch(FAMILY, TABLE, tuple(changes))


def render_add(elements: Iterable[Element]) -> str:
    return "".join(
        f'add element {FAMILY} {TABLE} {e.set} {{ {e.key} comment "{e.tag}" }}\n' for e in elements
    )


def render_delete(elements: Iterable[Element]) -> str:
    return "".join(
        f"delete element {FAMILY} {TABLE} {e.set} {{ {e.key} }}\n"
        for e in sorted(elements, key=lambda e: (e.set, e.key))
    )


def parse_elements(doc: dict) -> list[Element]:
    """The elements of our sets in a `nft -j list table` document."""
    out = []
    for found in _our_sets(doc):
        types = found.get("type")
        types = types if isinstance(types, list) else [types]
        for elem in found.get("elem", []):
            out.append(_element(found["name"], elem, types))
    return out


def _our_sets(doc: dict) -> list[dict]:
    sets = (item.get("set") for item in doc.get("nftables", []))
    return [s for s in sets if s and s.get("table") == TABLE and s.get("name") in SETS]


def _element(set_name: str, elem: Any, types: list | None = None) -> Element:
    if isinstance(elem, dict) and "elem" in elem:
        return Element(set_name, key_text(elem["elem"]["val"], types), elem["elem"].get("comment"))
    return Element(set_name, key_text(elem, types), None)


def key_text(value: Any, types: list | None = None) -> str:
    """A JSON element value as canonical nft key syntax. ``types`` is the set's type (one
    per concatenated part): an ``ifname`` part is quoted even when it looks like an address
    (a bridge may be named "10.0.0.1"); without it, a part that is no address is a name."""
    if isinstance(value, dict):
        if "concat" in value:
            parts = value["concat"]
            kinds = list(types or [])[: len(parts)] + [None] * (len(parts) - len(types or []))
            return " . ".join(
                f'"{part}"' if kind == "ifname" else key_text(part)
                for part, kind in zip(parts, kinds, strict=True)
            )
        if "prefix" in value:
            p = value["prefix"]
            return canon_network(ipaddress.ip_network(f"{p['addr']}/{p['len']}", strict=False))
        if "range" in value:
            return "-".join(key_text(part) for part in value["range"])
        if "elem" in value:
            return key_text(value["elem"]["val"])
    text = str(value)
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return f'"{text}"'  # an interface name, as it is written

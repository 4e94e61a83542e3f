"""Rendering pycni-bridge's masquerade table (pure): static chains, per-attachment data in sets.

knftables style: the table, its sets and its one chain are static; an attachment only adds
and removes set elements, each carrying the attachment tag as its comment, so DEL and GC find
them with no prevResult and no pod netns:

    table inet pycni-masq {
      set masq4   { type ipv4_addr; }                          # pod addresses to masquerade
      set nomasq4 { type ipv4_addr . ipv4_addr; flags interval; }  # pod . its own subnet
      (masq6 / nomasq6 alike)
      chain postrouting {
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr . ip daddr @nomasq4 return                    # inside its own subnet
        ip saddr @masq4 ip daddr != 224.0.0.0/4 masquerade     # leaving it, not multicast
      }
    }

Same behaviour as the reference per-container chain (`-d <subnet> ACCEPT`, `! -d 224.0.0.0/4
MASQUERADE`). Reading back uses `nft -j` JSON only (``parse_elements``).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Iterable

FAMILY = "inet"
TABLE = "pycni-masq"
CHAIN = "postrouting"
MULTICAST = {4: "224.0.0.0/4", 6: "ff00::/8"}
ADDR_TYPE = {4: "ipv4_addr", 6: "ipv6_addr"}
MATCH = {4: "ip", 6: "ip6"}
SETS = ("masq4", "nomasq4", "masq6", "nomasq6")


@dataclass(frozen=True)
class Element:
    """One set element: ``key`` in nft syntax, ``tag`` (its comment) not part of identity."""

    set: str
    key: str
    tag: str | None = field(default=None, compare=False)


def render_table() -> str:
    """The static part, idempotent: (re)creates the table, sets and chain, rewrites the rules."""
    t = f"{FAMILY} {TABLE}"
    lines = [f'add table {t} {{ comment "pycni-bridge ipMasq"; }}',
             f"add chain {t} {CHAIN} {{ type nat hook postrouting priority srcnat; policy accept; }}"]
    for v in (4, 6):
        lines.append(f"add set {t} masq{v} {{ type {ADDR_TYPE[v]}; }}")
        lines.append(f"add set {t} nomasq{v} {{ type {ADDR_TYPE[v]} . {ADDR_TYPE[v]}; flags interval; }}")
    lines.append(f"flush chain {t} {CHAIN}")
    for v in (4, 6):
        m = MATCH[v]
        lines.append(f"add rule {t} {CHAIN} {m} saddr . {m} daddr @nomasq{v} return")
    for v in (4, 6):
        m = MATCH[v]
        lines.append(f"add rule {t} {CHAIN} {m} saddr @masq{v} {m} daddr != {MULTICAST[v]} masquerade")
    return "\n".join(lines) + "\n"


def canon_network(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
    """How nft prints a prefix: a full-length one as a bare address."""
    if network.prefixlen == network.max_prefixlen:
        return str(network.network_address)
    return str(network)


def elements_for(tag: str, pairs: Iterable[tuple[Any, Any]]) -> list[Element]:
    """The elements of one attachment: for each (pod address, own subnet) one masq and one
    nomasq element."""
    out = []
    for address, subnet in pairs:
        v = address.version
        out.append(Element(f"masq{v}", str(address), tag))
        out.append(Element(f"nomasq{v}", f"{address} . {canon_network(subnet)}", tag))
    return out


def render_add(elements: Iterable[Element]) -> str:
    return "".join(f'add element {FAMILY} {TABLE} {e.set} {{ {e.key} comment "{e.tag}" }}\n'
                   for e in elements)


def render_delete(elements: Iterable[Element]) -> str:
    return "".join(f"delete element {FAMILY} {TABLE} {e.set} {{ {e.key} }}\n"
                   for e in sorted(elements, key=lambda e: (e.set, e.key)))


def parse_elements(doc: dict) -> list[Element]:
    """The elements of our sets in a `nft -j list table` document."""
    out = []
    for item in doc.get("nftables", []):
        found = item.get("set")
        if not found or found.get("table") != TABLE or found.get("name") not in SETS:
            continue
        for elem in found.get("elem", []):
            out.append(_element(found["name"], elem))
    return out


def _element(set_name: str, elem: Any) -> Element:
    if isinstance(elem, dict) and "elem" in elem:
        return Element(set_name, key_text(elem["elem"]["val"]), elem["elem"].get("comment"))
    return Element(set_name, key_text(elem), None)


def key_text(value: Any) -> str:
    """A JSON element value as canonical nft key syntax."""
    if isinstance(value, dict):
        if "concat" in value:
            return " . ".join(key_text(part) for part in value["concat"])
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
        return text

"""Reading pycni's nftables tables for the doctor (mechanism, no policy): the elements keyed
by Pod addresses (masquerade, NetworkPolicy, the proxy's backends, the overlay firewall's
peers), every table's name, and each current table's objects with what references what.

The calling thread must be in the node's netns (``Nft`` refuses anything else).
"""

from __future__ import annotations

from typing import Any

from doctor.findings import CURRENT_TABLES, NftElement, NftObject, NftTable, TableGraph
from kernel.nft import Nft, table_exists
from masq import rules as masq_rules
from masq.rules import Element
from netpol import render as netpol_render
from overlay import firewall as overlay_firewall
from services.proxy import render as proxy_render

PEER_SETS = ("peers4", "peers6")  # overlay/firewall.py
#: the NetworkPolicy sets and maps keyed by a local Pod's address (netpol/render.py)
NETPOL_SETS = tuple(
    f"{name}{family}"
    for family in netpol_render.FAMILIES
    for name in ("self", "ingress", "egress", "dropcnt-in", "dropcnt-eg")
)


def read_graphs(nft: Nft) -> list[TableGraph]:
    """The object graph of every table the current code makes that the kernel holds."""
    return [
        table_graph(family, name, nft.list_json(f"list table {family} {name}"))
        for family, name in sorted(CURRENT_TABLES)
        if table_exists(nft, family, name)
    ]


def table_graph(family: str, table: str, doc: dict) -> TableGraph:
    objects: list[NftObject] = []
    base: set[str] = set()
    refs: dict[str, frozenset[str]] = {}
    for item in doc.get("nftables", []):
        kind = next((k for k in ("chain", "set", "map", "rule") if k in item), None)
        body = item.get(kind) if kind else None
        if kind is None or not body:
            continue
        if kind == "rule":
            key = f"chain:{body['chain']}"
            refs[key] = refs.get(key, frozenset()) | references(body.get("expr"))
            continue
        found = NftObject(family, table, kind, body["name"])
        objects.append(found)
        if kind == "chain" and "hook" in body:
            base.add(found.ref)
        refs[found.ref] = refs.get(found.ref, frozenset()) | references(body.get("elem"))
    return TableGraph(tuple(objects), frozenset(base), refs)


def references(value: Any) -> frozenset[str]:
    """Every chain (jump/goto target) and set (``@name``) a JSON expression names."""
    if isinstance(value, str):
        return frozenset({f"set:{value[1:]}"}) if value.startswith("@") else frozenset()
    if isinstance(value, list):
        return frozenset().union(*map(references, value))
    if not isinstance(value, dict):
        return frozenset()
    out = frozenset().union(*map(references, value.values()))
    for verdict in ("jump", "goto"):
        target = value.get(verdict)
        if isinstance(target, dict) and "target" in target:
            out |= {f"chain:{target['target']}"}
    return out


def read_backends(nft: Nft) -> list[NftElement]:
    """The elements of the proxy's backends maps: (entry . protocol . port . index) ->
    backend address . port, in both families' tables."""
    out = []
    for family in proxy_render.FAMILY.values():
        if not table_exists(nft, family, proxy_render.TABLE):
            continue
        doc = nft.list_json(f"list table {family} {proxy_render.TABLE}")
        for item in doc.get("nftables", []):
            found = item.get("map")
            if found and found.get("name") in proxy_render.BACKENDS_MAPS:
                out += [backend_element(family, found["name"], e) for e in found.get("elem", [])]
    return out


def backend_element(family: str, map_name: str, elem: Any) -> NftElement:
    key, value = elem
    address = masq_rules.key_text(value).split(" . ")[0]
    return NftElement(family, proxy_render.TABLE, map_name, masq_rules.key_text(key), address)


def read_overlay_peers(nft: Nft) -> list[NftElement]:
    """The elements of the overlay firewall's peers sets (underlay addresses)."""
    family, table = overlay_firewall.FAMILY, overlay_firewall.TABLE
    if not table_exists(nft, family, table):
        return []
    doc = nft.list_json(f"list table {family} {table}")
    sets = (item.get("set") for item in doc.get("nftables", []))
    return [
        NftElement(family, table, found["name"], key, key)
        for found in sets
        if found and found.get("name") in PEER_SETS
        for key in map(masq_rules.key_text, found.get("elem", []))
    ]


def read_masq(nft: Nft) -> tuple[list[Element], bool]:
    """The masquerade table's elements and whether its sets are in the first layout."""
    if not table_exists(nft, masq_rules.FAMILY, masq_rules.TABLE):
        return [], False
    doc = nft.list_json(f"list table {masq_rules.FAMILY} {masq_rules.TABLE}")
    return masq_rules.parse_elements(doc), masq_rules.is_legacy(doc)


def read_netpol(nft: Nft) -> list[NftElement]:
    if not table_exists(nft, "inet", netpol_render.TABLE):
        return []
    doc = nft.list_json(f"list table inet {netpol_render.TABLE}")
    out = []
    for item in doc.get("nftables", []):
        found = item.get("set") or item.get("map")
        if found and found.get("name") in NETPOL_SETS:
            out += [netpol_element(found["name"], elem) for elem in found.get("elem", [])]
    return out


def netpol_element(set_name: str, elem: Any) -> NftElement:
    """A set element (``a . a``) or a map element (``[key, value]``), by its key."""
    value = elem[0] if isinstance(elem, list) else elem
    key = masq_rules.key_text(value)
    return NftElement("inet", netpol_render.TABLE, set_name, key, key.split(" . ")[0])


def read_tables(nft: Nft) -> list[NftTable]:
    doc = nft.list_json("list tables")
    tables = (item["table"] for item in doc.get("nftables", []) if "table" in item)
    return [NftTable(t["family"], t["name"]) for t in tables]

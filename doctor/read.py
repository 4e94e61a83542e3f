"""Reading the node for the doctor (mechanism, no policy): the store's handles, IPAM check's
problems, the labelled host veths, the elements of pycni's tables, the tables, and which
networks pycni-bridge serves with pycni-ipam (from the CNI config directory).

Everything is read in the calling thread's netns (the node's: run `pycni doctor` there, as
pycnid runs).
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Iterable
from typing import Any

from cni.runtime.conflist import LEGACY_EXTENSIONS, LIST_EXTENSIONS, conf_files
from common.attachment import tag_of_alias
from doctor.findings import (
    CURRENT_TABLES,
    Lease,
    NftElement,
    NftObject,
    NftTable,
    NodeFacts,
    Peers,
    TableGraph,
    Veth,
)
from ipam.ops.check import find_problems
from ipam.ops.inspect import Snapshot
from ipam.ops.repair import read_snapshot
from ipam.records import HandleRecord
from kernel import link, ndproxy, neigh, route
from kernel.nft import Nft, table_exists
from kernel.route import RTPROT_PYCNI
from kernel.session import node_session
from masq import rules as masq_rules
from masq.rules import Element
from netpol import render as netpol_render
from nodes.record import NodeRecord, OverlayInfo
from overlay import firewall as overlay_firewall
from services.proxy import render as proxy_render
from services.record import EndpointRecord
from store.base import KV, Store
from store.keys import BUFFER_NETWORK, ENDPOINTS, HANDLES, NODES, VTEP_NETWORK

NOT_ATTACHMENTS = (BUFFER_NETWORK, VTEP_NETWORK)  # handles of the node itself, no Pod
PEER_SETS = ("peers4", "peers6")  # overlay/firewall.py
#: the NetworkPolicy sets and maps keyed by a local Pod's address (netpol/render.py)
NETPOL_SETS = tuple(
    f"{name}{family}"
    for family in netpol_render.FAMILIES
    for name in ("self", "ingress", "egress", "dropcnt-in", "dropcnt-eg")
)


def read_facts(
    store: Store,
    nft: Nft,
    node: str,
    networks: Iterable[str],
    device: str | None,
    endpoints_in_store: bool = True,
    young_after: float = float("inf"),
) -> NodeFacts:
    """One look at the node; ``device``: the overlay's VXLAN device (None: no overlay);
    ``endpoints_in_store``: the Service proxy reads its endpoints from the store (not from the
    API server)."""
    masq, legacy = read_masq(nft)
    snapshot = read_snapshot(store)
    return NodeFacts(
        node=node,
        networks=frozenset(networks),
        ipam_problems=tuple(find_problems(snapshot)),
        leases=tuple(read_leases(store)),
        veths=tuple(read_veths()),
        masq=tuple(masq),
        masq_legacy=legacy,
        netpol=tuple(read_netpol(nft)),
        tables=tuple(read_tables(nft)),
        peers=read_peers(store, nft, snapshot, device),
        backends=tuple(read_backends(nft)),
        endpoint_ips=read_endpoint_ips(store) if endpoints_in_store else None,
        young_after=young_after,
        graphs=tuple(read_graphs(nft)),
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


def read_endpoint_ips(store: Store) -> frozenset[str]:
    """Every address an endpoint record names; one that does not decode names none."""
    out: set[str] = set()
    for kv in store.range(ENDPOINTS):
        try:
            out.update(EndpointRecord.from_bytes(kv.key, kv.value).ips)
        except ValueError:
            continue
    return frozenset(str(ipaddress.ip_address(ip)) for ip in out)


def read_peers(store: Store, nft: Nft, snapshot: Snapshot, device: str | None) -> Peers:
    records = list(store.range(NODES))
    blocks = tuple((b.cidr, b.affinity) for b in snapshot.blocks.values())
    allocated = frozenset(
        str(ipaddress.ip_address(ip)) for b in snapshot.blocks.values() for ip in b.allocations
    )
    with node_session() as ipr:
        found = link.get_link(ipr, device) if device else None
        index = found.index if found is not None and found.kind == "vxlan" else None
        return Peers(
            recorded=frozenset(kv.key[len(NODES) :] for kv in records),
            overlays=tuple(read_overlays(records)),
            blocks=blocks,
            allocated=allocated,
            routes=tuple(route.list_proto_routes(ipr, RTPROT_PYCNI)),
            neighs=tuple(neigh.list_neighs(ipr, index, RTPROT_PYCNI) if index else ()),
            fdbs=tuple(neigh.list_fdb(ipr, index) if index else ()),
            accepted=tuple(read_overlay_peers(nft)),
            proxies=tuple(ndproxy.list_proxies(ipr, proto=RTPROT_PYCNI)),
        )


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


def read_overlays(records: Iterable[KV]) -> list[OverlayInfo]:
    """The overlay fields of the node records that decode (a corrupt one names no VTEP)."""
    out = []
    for kv in records:
        try:
            overlay = NodeRecord.from_bytes(kv.key, kv.value).overlay
        except ValueError:
            continue
        if overlay is not None:
            out.append(overlay)
    return out


def read_leases(store: Store) -> list[Lease]:
    """Every attachment's handle; one that does not decode is IPAM check's to report."""
    out = []
    for kv in store.range(HANDLES):
        try:
            record = HandleRecord.from_bytes(kv.key, kv.value)
        except ValueError:
            continue
        if record.handle.network not in NOT_ATTACHMENTS:
            out.append(Lease(kv, record))
    return out


def read_veths() -> list[Veth]:
    with node_session() as ipr:
        links = link.list_links(ipr)
    return [
        Veth(found.name, tag)
        for found in links
        if found.kind == "veth" and (tag := tag_of_alias(found.alias))
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


def read_bridge_networks(conf_dir: str) -> list[str]:
    """Networks of the CNI config directory whose pycni-bridge leases from pycni-ipam; a file
    that does not read as JSON is not one."""
    names = []
    for path in conf_files(conf_dir, LIST_EXTENSIONS + LEGACY_EXTENSIONS):
        try:
            with open(path, "rb") as fh:
                conf = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(conf, dict) and any(map(is_bridge_with_ipam, plugins_of(conf))):
            names.append(str(conf.get("name", "")))
    return names


def plugins_of(conf: dict[str, Any]) -> list[Any]:
    plugins = conf.get("plugins")
    return plugins if isinstance(plugins, list) else [conf]


def is_bridge_with_ipam(plugin: Any) -> bool:
    if not isinstance(plugin, dict) or plugin.get("type") != "pycni-bridge":
        return False
    ipam = plugin.get("ipam")
    return isinstance(ipam, dict) and ipam.get("type") == "pycni-ipam"


def default_conf_dir() -> str:
    return os.environ.get("NETCONFPATH") or "/etc/cni/net.d"

"""Reading the node for the doctor (mechanism, no policy): the store's handles, IPAM check's
problems, node records, blocks and endpoint records, the labelled host veths, the overlay's
routes, neighbours, FDB and proxy entries, pycni's tables (``doctor/tables.py``), and which
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
from doctor.findings import Lease, NodeFacts, Peers, Veth
from doctor.tables import (
    read_backends,
    read_graphs,
    read_masq,
    read_netpol,
    read_overlay_peers,
    read_tables,
)
from ipam.ops.check import find_problems
from ipam.ops.inspect import Snapshot
from ipam.ops.repair import read_snapshot
from ipam.records import HandleRecord
from kernel import link, ndproxy, neigh, route
from kernel.nft import Nft
from kernel.route import RTPROT_PYCNI
from kernel.session import node_session
from nodes.record import NodeRecord, OverlayInfo
from services.record import EndpointRecord
from store.base import KV, Store
from store.keys import BUFFER_NETWORK, ENDPOINTS, HANDLES, NODES, VTEP_NETWORK

NOT_ATTACHMENTS = (BUFFER_NETWORK, VTEP_NETWORK)  # handles of the node itself, no Pod


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

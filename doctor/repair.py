"""Repairing what the checks found: one ``repair_*`` per kind, each returning None when done
(or already gone) and why not otherwise.

- ipam: check's own fixes (``ipam/ops/repair.py:apply_fix``), as `pycni ipam gc` applies them;
- veth: deleted (its peer in the Pod's netns goes with it);
- lease: released as the reaper releases a dead node's (``nodes/reclaim.py``): the attachment
  has no interface on this node, so no traffic uses the address;
- masquerade, NetworkPolicy and overlay firewall elements: deleted, one nft transaction each;
- overlay routes, FDB entries, neighbours and IPv6 proxy entries: deleted (in that order, as
  the overlay removes a peer's);
- a Service backend: not repaired here, pycnid's proxy rewrites it (``repair_service_backend``);
- a stale table, or a chain, set or map nothing reaches: deleted; the masquerade table in the
  first layout: rewritten as pycnid does on its first read, keeping live attachments' elements.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from doctor.findings import Finding, Lease, NftElement, NftObject, NftTable, Veth
from ipam.ops.repair import apply_fix
from kernel import link, ndproxy, neigh, route
from kernel.ndproxy import Proxy
from kernel.neigh import Fdb, Neigh
from kernel.nft import NO_SUCH, Nft, NftError
from kernel.session import node_session
from masq import rules as masq_rules
from masq.table import live_attachments
from nodes.reclaim import release_guarded
from store.base import Store

Repair = Callable[[Store, Nft, Finding], str | None]


def repair_ipam(store: Store, nft: Nft, finding: Finding) -> str | None:
    if not finding.target.fixes:
        return "IPAM check has no fix for it"
    for fix in finding.target.fixes:
        status, detail = apply_fix(store, fix, time.time())
        if status == "failed":
            return detail
    return None


def repair_veth(store: Store, nft: Nft, finding: Finding) -> str | None:
    veth: Veth = finding.target
    with node_session() as ipr:
        link.delete_link(ipr, veth.name)  # False: already gone
    return None


def repair_lease(store: Store, nft: Nft, finding: Finding) -> str | None:
    lease: Lease = finding.target
    release_guarded(store, lease.kv, lease.record.node, ())  # None: gone or moved meanwhile
    return None


def repair_masq_element(store: Store, nft: Nft, finding: Finding) -> str | None:
    return run_nft(nft, masq_rules.render_delete([finding.target]))


def repair_nft_element(store: Store, nft: Nft, finding: Finding) -> str | None:
    elem: NftElement = finding.target
    return run_nft(nft, f"delete element {elem.family} {elem.table} {elem.set} {{ {elem.key} }}\n")


def repair_table(store: Store, nft: Nft, finding: Finding) -> str | None:
    table: NftTable = finding.target
    return run_nft(nft, f"table {table} {{}}\ndelete table {table}\n")


def repair_nft_object(store: Store, nft: Nft, finding: Finding) -> str | None:
    o: NftObject = finding.target
    return run_nft(nft, f"delete {o.kind} {o.family} {o.table} {o.name}\n")


def repair_masq_layout(store: Store, nft: Nft, finding: Finding) -> str | None:
    doc = nft.list_json(f"list table {masq_rules.FAMILY} {masq_rules.TABLE}")
    legacy = masq_rules.parse_elements(doc)
    kept = masq_rules.migrate_elements(legacy, live_attachments())
    return run_nft(nft, masq_rules.render_migration(kept))


def repair_overlay_route(store: Store, nft: Nft, finding: Finding) -> str | None:
    with node_session() as ipr:
        route.delete_route(ipr, finding.target)  # False: already gone
    return None


def repair_overlay_fdb(store: Store, nft: Nft, finding: Finding) -> str | None:
    entry: Fdb = finding.target
    with node_session() as ipr:
        neigh.delete_fdb(ipr, entry.ifindex, entry.mac, entry.dst)
    return None


def repair_overlay_neigh(store: Store, nft: Nft, finding: Finding) -> str | None:
    entry: Neigh = finding.target
    with node_session() as ipr:
        neigh.delete_neigh(ipr, entry.ifindex, entry.ip)
    return None


def repair_service_backend(store: Store, nft: Nft, finding: Finding) -> str | None:
    return (
        "left to pycnid's proxy, which rewrites its table from the records at every full "
        "render (services.resyncInterval): deleting one backend would leave a hole in its "
        "Service's dispatch (numgen mod N)"
    )


def repair_overlay_proxy(store: Store, nft: Nft, finding: Finding) -> str | None:
    entry: Proxy = finding.target
    with node_session() as ipr:
        ndproxy.delete_proxy(ipr, entry.ifindex, entry.ip)
    return None


def run_nft(nft: Nft, script: str) -> str | None:
    try:
        nft.run(script)
    except NftError as exc:
        return None if NO_SUCH in str(exc) else str(exc)  # already gone: done
    return None


REPAIRS: dict[str, Repair] = {
    "ipam": repair_ipam,
    "veth": repair_veth,
    "lease": repair_lease,
    "masq-element": repair_masq_element,
    "netpol-element": repair_nft_element,
    "overlay-peer": repair_nft_element,
    "svc-backend": repair_service_backend,
    "table": repair_table,
    "nft-object": repair_nft_object,
    "masq-layout": repair_masq_layout,
    "overlay-route": repair_overlay_route,
    "overlay-fdb": repair_overlay_fdb,
    "overlay-neigh": repair_overlay_neigh,
    "overlay-proxy": repair_overlay_proxy,
}

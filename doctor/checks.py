"""What counts as unexplained on a node (pure policy over ``NodeFacts``): one ``find_*`` per
kind of residue, each returning its findings.

An attachment is explained by its lease (pycni-ipam's handle of this node) and its host veth
(named by the attachment tag in its alias, ``common/attachment.py``): one without the other is
residue, but only in the networks where pycni-bridge leases from pycni-ipam (``facts.networks``)
— under another IPAM a veth has no handle, under another plugin a handle has no pycni veth.
An nft element keyed by a Pod address is explained by a lease of that address; a masquerade
element also by its attachment's veth (another IPAM's address); a Service backend by an
endpoint record naming its address. A ``pycni-*`` table is explained by being one the current
code makes (``CURRENT_TABLES``). The overlay's entries are ``doctor/peers.py``'s.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable, Iterable

from common.attachment import Attachment, tag_in_network
from doctor.findings import CURRENT_TABLES, TABLE_PREFIX, Finding, Lease, NodeFacts, TableGraph
from masq import rules as masq_rules
from netpol import render as netpol_render
from netpol.evaluate import PolicyInputs
from overlay import firewall as overlay_firewall
from services.proxy import render as proxy_render


def attachment_tag(lease: Lease) -> str:
    handle = lease.record.handle
    return Attachment(handle.network, handle.container_id, handle.ifname).tag


def in_networks(tag: str, networks: Iterable[str]) -> bool:
    return any(tag_in_network(tag, network) for network in networks)


def node_leases(facts: NodeFacts) -> list[Lease]:
    return [lease for lease in facts.leases if lease.record.node == facts.node]


def is_veth_unexplained(facts: NodeFacts, tag: str, leased: set[str]) -> bool:
    return in_networks(tag, facts.networks) and tag not in leased


def is_lease_unexplained(facts: NodeFacts, lease: Lease, tags: set[str]) -> bool:
    return (
        lease.record.node == facts.node
        and lease.record.handle.network in facts.networks
        and lease.record.created_at <= facts.young_after
        and attachment_tag(lease) not in tags
    )


def leased_addresses(facts: NodeFacts) -> frozenset[str]:
    """The addresses of the leases that stay: a repair releases the unexplained ones."""
    tags = {veth.tag for veth in facts.veths}
    return frozenset(
        str(ipaddress.ip_address(ip.ip))
        for lease in facts.leases
        if not is_lease_unexplained(facts, lease, tags)
        for ip in lease.record.ips
    )


def released_addresses(facts: NodeFacts) -> frozenset[str]:
    """The addresses of the leases a repair releases."""
    tags = {veth.tag for veth in facts.veths}
    return frozenset(
        str(ipaddress.ip_address(ip.ip))
        for lease in facts.leases
        if is_lease_unexplained(facts, lease, tags)
        for ip in lease.record.ips
    )


def live_tags(facts: NodeFacts) -> set[str]:
    """The tags of the host veths that stay: a repair deletes the unexplained ones."""
    leased = {attachment_tag(lease) for lease in node_leases(facts)}
    return {v.tag for v in facts.veths if not is_veth_unexplained(facts, v.tag, leased)}


def find_ipam_problems(facts: NodeFacts) -> list[Finding]:
    """What `pycni ipam check` finds (``ipam/ops/check.py``), cluster-wide."""
    return [Finding("ipam", p.key, f"{p.kind}: {p.message}", p) for p in facts.ipam_problems]


def find_veths_without_lease(facts: NodeFacts) -> list[Finding]:
    leased = {attachment_tag(lease) for lease in node_leases(facts)}
    return [
        Finding("veth", veth.name, f"host veth of {veth.tag}, which holds no lease", veth)
        for veth in facts.veths
        if is_veth_unexplained(facts, veth.tag, leased)
    ]


def find_leases_without_veth(facts: NodeFacts) -> list[Finding]:
    tags = {veth.tag for veth in facts.veths}
    return [
        Finding(
            "lease",
            str(lease.record.handle),
            f"lease of {', '.join(ip.ip for ip in lease.record.ips) or 'no address'} "
            "whose attachment has no host veth on this node",
            lease,
        )
        for lease in facts.leases
        if is_lease_unexplained(facts, lease, tags)
    ]


def find_masq_elements(facts: NodeFacts) -> list[Finding]:
    """In the first layout (keyed by the address alone) the table is judged whole
    (``masq-layout``): its rewrite keeps only live attachments' elements."""
    leased, live = leased_addresses(facts), live_tags(facts)
    return [
        Finding(
            "masq-element",
            f"{masq_rules.FAMILY} {masq_rules.TABLE} {elem.set} {{ {elem.key} }}",
            f"masquerade element for {masq_rules.describe_key(elem.key)}, which no lease "
            "holds and no host veth explains",
            elem,
        )
        for elem in facts.masq
        if not facts.masq_legacy and masq_address(elem.key) not in leased and elem.tag not in live
    ]


def masq_address(key: str) -> str:
    return key.split(" . ")[1]


def find_netpol_elements(facts: NodeFacts) -> list[Finding]:
    leased = leased_addresses(facts)
    return [
        Finding(
            "netpol-element",
            f"{elem.family} {elem.table} {elem.set} {{ {elem.key} }}",
            f"NetworkPolicy element for {elem.address}, which no lease holds",
            elem,
        )
        for elem in facts.netpol
        if elem.address not in leased
    ]


def find_service_backends(facts: NodeFacts) -> list[Finding]:
    """Backends no endpoint record names (judged only when the store holds the endpoints)."""
    if facts.endpoint_ips is None:
        return []
    return [
        Finding(
            "svc-backend",
            f"{elem.family} {elem.table} {elem.set} {{ {elem.key} }}",
            f"Service backend {elem.address}, which no endpoint record names",
            elem,
        )
        for elem in facts.backends
        if elem.address not in facts.endpoint_ips
    ]


def find_stale_tables(facts: NodeFacts) -> list[Finding]:
    found = [
        Finding("table", str(t), "a pycni table the current code does not make", t)
        for t in facts.tables
        if t.name.startswith(TABLE_PREFIX) and (t.family, t.name) not in CURRENT_TABLES
    ]
    if facts.masq_legacy:
        table = f"{masq_rules.FAMILY} {masq_rules.TABLE}"
        found.append(Finding("masq-layout", table, "sets in the address-keyed first layout"))
    return found


def find_unused_objects(facts: NodeFacts) -> list[Finding]:
    """Chains, sets and maps of pycni's tables that the code does not declare statically and
    nothing reaches from a base chain: shape and affinity objects a restart of an older pycni
    left (the proxy's full render deletes them)."""
    static = static_objects()
    return [
        Finding("nft-object", str(o), "not static, and nothing reaches it from a base chain", o)
        for graph in facts.graphs
        for o in graph.objects
        if (o.kind, o.family, o.table, o.name) not in static and o.ref not in reachable(graph)
    ]


ADDED = re.compile(r"^add (chain|set|map) (\S+) (\S+) (\S+)", re.M)


@functools.cache
def static_objects() -> frozenset[tuple[str, ...]]:
    """(kind, family, table, name) of what each owner declares whatever its data, read from
    the owners' own renders of an empty state."""
    scripts = (
        masq_rules.render_table(),
        netpol_render.render_full(netpol_render.calc_layout(PolicyInputs(), "")),
        overlay_firewall.render_table("192.0.2.1", 4789, ()),
        *(proxy_render.render_skeleton(family) for family in proxy_render.FAMILY),
    )
    return frozenset(match for script in scripts for match in ADDED.findall(script))


def reachable(graph: TableGraph) -> set[str]:
    seen: set[str] = set()
    todo = list(graph.base)
    while todo:
        ref = todo.pop()
        if ref not in seen:
            seen.add(ref)
            todo.extend(graph.refs.get(ref, ()))
    return seen


NODE_CHECKS: tuple[Callable[[NodeFacts], list[Finding]], ...] = (
    find_ipam_problems,
    find_veths_without_lease,
    find_leases_without_veth,
    find_masq_elements,
    find_netpol_elements,
    find_service_backends,
    find_stale_tables,
    find_unused_objects,
)

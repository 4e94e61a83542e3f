"""What counts as unexplained in the overlay's entries (pure policy over ``NodeFacts``).

The overlay (``overlay/model.py``) programs, per remote node, routes to its blocks and to the
addresses it holds in other nodes' blocks, and on VXLAN a permanent neighbour per VTEP address
and an FDB entry for its VTEP MAC; on this node, host routes for its own borrowed addresses.
On a bridge whose subnet holds a peer's IPv6 address, an ND proxy entry answers for it. The
firewall (``overlay/firewall.py``) accepts VXLAN from the underlay addresses in its peers
sets. An entry is explained by a node record and the store's blocks and leases: a route to a
block a recorded node owns or to an allocated address, a neighbour for a recorded node's VTEP
address, an FDB entry for a recorded node's VTEP MAC, a proxy entry for an allocated address,
a peers element for a recorded node's
underlay. What a departed node left is none of these.
"""

from __future__ import annotations

import ipaddress

from doctor.checks import released_addresses
from doctor.findings import Finding, NodeFacts


def held_addresses(facts: NodeFacts) -> set[str]:
    """What the overlay programs host entries for (``overlay/registry.py``: a block's
    allocations, whichever handle holds them: a Pod's, a node's VTEP, its outage buffer),
    less what a repair releases."""
    return set(facts.peers.allocated - released_addresses(facts))


def explained_routes(facts: NodeFacts) -> set[str]:
    recorded = facts.peers.recorded
    blocks = {str(ipaddress.ip_network(c)) for c, owner in facts.peers.blocks if owner in recorded}
    hosts = {str(ipaddress.ip_network(ip)) for ip in held_addresses(facts)}
    return blocks | hosts


def find_overlay_routes(facts: NodeFacts) -> list[Finding]:
    explained = explained_routes(facts)
    return [
        Finding(
            "overlay-route",
            f"{r.dst} via {r.gw or '-'} proto 77",
            "route to no block of a recorded node and no allocated address",
            r,
        )
        for r in facts.peers.routes
        if str(r.dst) not in explained
    ]


def find_overlay_neighbours(facts: NodeFacts) -> list[Finding]:
    vteps = {ipaddress.ip_address(v) for info in facts.peers.overlays for v in info.vteps}
    return [
        Finding("overlay-neigh", f"{n.ip} lladdr {n.mac}", "no recorded node has this VTEP", n)
        for n in facts.peers.neighs
        if n.ip not in vteps
    ]


def find_overlay_fdb(facts: NodeFacts) -> list[Finding]:
    macs = {info.vtep_mac.lower() for info in facts.peers.overlays}
    return [
        Finding("overlay-fdb", f"{f.mac} dst {f.dst}", "no recorded node has this VTEP MAC", f)
        for f in facts.peers.fdbs
        if f.mac not in macs
    ]


def find_overlay_firewall(facts: NodeFacts) -> list[Finding]:
    underlays = {ipaddress.ip_address(info.underlay) for info in facts.peers.overlays}
    return [
        Finding(
            "overlay-peer",
            f"{elem.family} {elem.table} {elem.set} {{ {elem.key} }}",
            "VXLAN accepted from an underlay address no node record names",
            elem,
        )
        for elem in facts.peers.accepted
        if ipaddress.ip_address(elem.address) not in underlays
    ]


def find_overlay_proxies(facts: NodeFacts) -> list[Finding]:
    held = held_addresses(facts)
    return [
        Finding(
            "overlay-proxy", f"proxy {p.ip} dev #{p.ifindex}", "no block allocates this address", p
        )
        for p in facts.peers.proxies
        if str(ipaddress.ip_address(p.ip)) not in held
    ]

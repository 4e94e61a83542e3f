"""The overlay's own nftables table: VXLAN only from registered nodes, and never tracked.

    table inet pycni-overlay {
      set peers4 { type ipv4_addr; }                # underlay addresses of registered nodes
      set peers6 { type ipv6_addr; }
      chain prerouting { type filter hook prerouting priority raw; policy accept;
        ip daddr 172.31.250.11 udp dport 4789 notrack }      # this node's VXLAN in
      chain output { type filter hook output priority raw; policy accept;
        ip saddr 172.31.250.11 udp dport 4789 notrack }      # and out
      chain input { type filter hook input priority filter; policy accept;
        udp dport 4789 ip saddr @peers4 accept
        udp dport 4789 ip6 saddr @peers6 accept
        udp dport 4789 drop }                                # anyone else's
    }

Conntrack would otherwise hold an UNREPLIED entry per VXLAN flow (Calico measured 46 % of a
node's table, calico#8934); notrack matches this node's own underlay address only, so a Pod's
UDP to port 4789 elsewhere is still tracked (and masqueraded). Every sync renders the whole
table and applies it as one transaction (``delete`` + ``add``): atomic, and a table someone
edited or removed comes back exactly as rendered. host-gw has no VXLAN and no table.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

FAMILY = "inet"
TABLE = "pycni-overlay"


def render_table(underlay: str, port: int, peers: Iterable[str]) -> str:
    """The whole table with ``peers`` (underlay addresses) in its sets, as one script."""
    local = ipaddress.ip_address(underlay)
    match = "ip" if local.version == 4 else "ip6"
    t = f"{FAMILY} {TABLE}"
    lines = [
        f"table {t} {{}}",
        f"delete table {t}",
        f'add table {t} {{ comment "pycni overlay: VXLAN peers"; }}',
        f"add set {t} peers4 {{ type ipv4_addr; }}",
        f"add set {t} peers6 {{ type ipv6_addr; }}",
        f"add chain {t} prerouting {{ type filter hook prerouting priority raw; policy accept; }}",
        f"add chain {t} output {{ type filter hook output priority raw; policy accept; }}",
        f"add chain {t} input {{ type filter hook input priority filter; policy accept; }}",
        f"add rule {t} prerouting {match} daddr {local} udp dport {port} notrack",
        f"add rule {t} output {match} saddr {local} udp dport {port} notrack",
        f"add rule {t} input udp dport {port} ip saddr @peers4 accept",
        f"add rule {t} input udp dport {port} ip6 saddr @peers6 accept",
        f"add rule {t} input udp dport {port} drop",
    ]
    by_version: dict[int, list[str]] = {4: [], 6: []}
    for peer in sorted({ipaddress.ip_address(p) for p in peers}, key=lambda a: (a.version, a)):
        by_version[peer.version].append(str(peer))
    for version, members in by_version.items():
        if members:
            lines.append(f"add element {t} peers{version} {{ {', '.join(members)} }}")
    return "\n".join(lines) + "\n"


def render_removal() -> str:
    return f"table {FAMILY} {TABLE} {{}}\ndelete table {FAMILY} {TABLE}\n"

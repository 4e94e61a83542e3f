"""Stale UDP conntrack entries after a sync (SVC-NOTES §1.6): what the kernel still sends to a
backend that no longer serves, or to nobody (entries made while the Service had none).

UDP has no end a conntrack entry could follow: a client reusing its socket keeps hitting the
entry's old translation (or the refusal it met while the Service was empty, the 0→N case)
until it idles out. After each sync, for every UDP entry point whose serving backends changed
(all of them after a full render), entries whose reply source is not a serving backend are
deleted. TCP is left alone: RST and FIN end it. The ``conntrack`` tool runs in pycnid's netns.
"""
from __future__ import annotations

import logging
import subprocess
from typing import Mapping

from .model import ProxyModel

log = logging.getLogger("pycnid.proxy")
# (orig dst IP: a VIP, an externalIP or a NodePort address, orig dst port)
Entry = tuple[str, int]


def calc_udp_serving(model: ProxyModel | None) -> dict[Entry, frozenset[str]]:
    """Every UDP entry point and the backend IPs that may answer it (policy ignored, as
    kube-proxy does: a Local-policy backend is still a serving one)."""
    out: dict[Entry, frozenset[str]] = {}
    for view in model.ports if model else ():
        if view.port.protocol != "udp":
            continue
        serving = frozenset(str(b.ip) for b in view.backends)
        for ip in (*view.service.vips, *view.service.external_ips):
            if ip.version == model.family:
                out[(str(ip), view.port.port)] = serving
        if view.port.node_port is not None:
            out.update({(str(ip), view.port.node_port): serving for ip in model.node.node_ips})
    return out


def calc_checks(before: Mapping[Entry, frozenset[str]], after: Mapping[Entry, frozenset[str]],
                full: bool) -> dict[Entry, frozenset[str]]:
    """The entry points to clean: changed ones, or all after a full render."""
    return {e: s for e, s in after.items() if full or before.get(e) != s}


def parse_reply_sources(listing: str) -> set[str]:
    """The reply source of every entry in ``conntrack -L`` text (the second ``src=``)."""
    found = set()
    for line in listing.splitlines():
        fields = [f[4:] for f in line.split() if f.startswith("src=")]
        if len(fields) >= 2:
            found.add(fields[1])
    return found


def selector_args(entry: Entry, family: int) -> list[str]:
    ip, port = entry
    return ["-f", "ipv6" if family == 6 else "ipv4", "-p", "udp", "--orig-dst", ip,
            "--dport", str(port)]


def clean_stale(checks: Mapping[Entry, frozenset[str]], family: int) -> int:
    """Delete the entries of ``checks`` answered by a non-serving source; how many sources."""
    deleted = 0
    for entry, serving in sorted(checks.items()):
        args = selector_args(entry, family)
        listing = _conntrack(["-L", *args])
        for source in sorted(parse_reply_sources(listing) - serving):
            _conntrack(["-D", *args, "--reply-src", source])
            deleted += 1
    return deleted


def _conntrack(args: list[str]) -> str:
    """The tool's output; an empty string when it finds nothing (it exits 1 then)."""
    try:
        done = subprocess.run(["conntrack", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("proxy: conntrack %s failed: %s", " ".join(args), exc)
        return ""
    return done.stdout

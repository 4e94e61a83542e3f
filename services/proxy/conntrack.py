"""Stale UDP conntrack entries after a sync (kube-proxy deletes them too): what the kernel still
sends to a backend that no longer serves, or to nobody (entries made while the Service had none).

UDP has no end a conntrack entry could follow: a client reusing its socket keeps hitting the
entry's old translation (or the refusal it met while the Service was empty, the 0→N case)
until it idles out. After each sync, for every UDP entry point whose serving backends changed
(all of them after a full render), entries whose reply source is not a serving backend are
deleted. TCP is left alone: RST and FIN end it. The ``conntrack`` tool runs in pycnid's netns.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from kernel.conntrack import run_conntrack
from services.proxy.model import ProxyModel

log = logging.getLogger("pycnid.proxy")
# (orig dst IP: a VIP, an externalIP or a NodePort address, orig dst port)
Entry = tuple[str, int]


def calc_udp_serving(model: ProxyModel | None) -> dict[Entry, frozenset[str]]:
    """Every UDP entry point and the backend IPs that may answer it (policy ignored, as
    kube-proxy does: a Local-policy backend is still a serving one)."""
    out: dict[Entry, frozenset[str]] = {}
    if model is None:
        return out
    for view in model.ports:
        if view.port.protocol != "udp":
            continue
        serving = frozenset(str(b.ip) for b in view.backends)
        for ip in (
            *view.service.vips,
            *view.service.external_ips,
            *view.service.load_balancer_ips,
        ):
            if ip.version == model.family:
                out[(str(ip), view.port.port)] = serving
        if view.port.node_port is not None:
            out.update({(str(ip), view.port.node_port): serving for ip in model.node.node_ips})
    return out


def calc_checks(
    before: Mapping[Entry, frozenset[str]], after: Mapping[Entry, frozenset[str]], full: bool
) -> dict[Entry, frozenset[str]]:
    """The entry points to clean, with who may still answer them: changed ones (all after a
    full render), and those gone, which nobody serves any more."""
    checks = {e: s for e, s in after.items() if full or before.get(e) != s}
    checks.update({e: frozenset() for e in before if e not in after})
    return checks


def parse_flows(listing: str) -> list[tuple[Entry, str]]:
    """((original destination, its port), reply source) of every entry in ``conntrack -L``
    text: the first ``dst=``/``dport=`` and the second ``src=`` of a line."""
    flows = []
    for line in listing.splitlines():
        fields: dict[str, list[str]] = {}
        for item in line.split():
            name, sep, value = item.partition("=")
            if sep:
                fields.setdefault(name, []).append(value)
        if len(fields.get("src", ())) >= 2 and fields.get("dst") and fields.get("dport"):
            try:
                flows.append(((fields["dst"][0], int(fields["dport"][0])), fields["src"][1]))
            except ValueError:
                continue
    return flows


def calc_stale(
    checks: Mapping[Entry, frozenset[str]], flows: list[tuple[Entry, str]]
) -> list[tuple[Entry, str]]:
    """(entry point, reply source) pairs to delete: a checked entry answered by a source
    that does not serve it."""
    return sorted(
        {
            (entry, source)
            for entry, source in flows
            if entry in checks and source not in checks[entry]
        }
    )


def selector_args(entry: Entry, family: int) -> list[str]:
    ip, port = entry
    return [
        "-f",
        "ipv6" if family == 6 else "ipv4",
        "-p",
        "udp",
        "--orig-dst",
        ip,
        "--dport",
        str(port),
    ]


def clean_stale(checks: Mapping[Entry, frozenset[str]], family: int) -> int:
    """Delete the entries of ``checks`` answered by a non-serving source; how many pairs.
    One listing of the family's UDP entries per pass (a process per entry point cost ~12 ms
    each: 1k UDP Service ports blocked a full render for 12 s), a delete per stale pair."""
    if not checks:
        return 0
    listing = run_conntrack(["-L", "-f", "ipv6" if family == 6 else "ipv4", "-p", "udp"], "proxy")
    stale = calc_stale(checks, parse_flows(listing))
    for entry, source in stale:
        run_conntrack(["-D", *selector_args(entry, family), "--reply-src", source], "proxy")
    return len(stale)

"""Helpers of the Service traffic-policy cluster tests: a backend that says who it saw, a client
that says what it got, conntrack read back as (original, reply) tuples, the proxy's elements.

The backend answers ``<its address>,<the peer's address>`` on port 8080 over IPv4 and IPv6 (one
dual-stack socket), so a test sees both which backend a connection reached and whether the
source arrived masqueraded."""

from __future__ import annotations

import ipaddress
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tests.fixtures.netns import Netns

from .pods import OverlayCluster, pycni_cli, python_in

CLIENT = """
import socket, sys
for _ in range(int(sys.argv[3])):
    try:
        with socket.create_connection(
            (sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4])
        ) as s:
            print(s.recv(128).decode() or "empty", flush=True)
    except OSError as exc:
        print(type(exc).__name__, flush=True)
"""


@dataclass(frozen=True)
class Flow:
    """One conntrack entry: the original direction and the reply direction's addresses."""

    src: str
    dst: str
    reply_src: str
    reply_dst: str


def connect(ns: Netns, ip: str, port: int, count: int, timeout: float = 2.0) -> list[str]:
    """``count`` connections: each ``backend,peer`` or the exception's name (TimeoutError,
    ConnectionRefusedError)."""
    out = subprocess.run(
        python_in(ns, CLIENT) + [ip, str(port), str(count), str(timeout)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def connect_each(probes: list[tuple[Netns, str, int, int, float]]) -> list[list[str]]:
    """``connect(*probe)`` for every probe at once, answers in the probes' order: probes that
    must time out then cost one timeout together, not one each."""
    with ThreadPoolExecutor(max_workers=len(probes)) as pool:
        return list(pool.map(lambda probe: connect(*probe), probes))


def backends_of(answers: list[str]) -> set[str]:
    """The backends that answered (errors kept as they are)."""
    return {a.split(",")[0] for a in answers}


def svc(cluster: OverlayCluster, *args: str) -> dict:
    """`pycni svc ARGS --output json` on the first node."""
    out = pycni_cli(cluster.nodes[0], "svc", *args, "--output", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def trace(cluster: OverlayCluster, src: str, dst: str, node: str) -> dict:
    """`pycni svc trace`'s answer for ``src`` -> ``dst`` (VIP:PORT/PROTO) on ``node``."""
    return svc(cluster, "trace", "--from", src, "--to", dst, "--node", node)["answer"]


def flows(ns: Netns, family: int, dst: str, port: int) -> list[Flow]:
    """The node's conntrack entries of TCP towards ``dst``:``port`` (original destination)."""
    out = ns.run(
        [
            "conntrack",
            "-L",
            "-f",
            "ipv6" if family == 6 else "ipv4",
            "-p",
            "tcp",
            "--orig-dst",
            dst,
            "--dport",
            str(port),
        ]
    ).stdout
    return parse_flows(out)


def parse_flows(text: str) -> list[Flow]:
    """`conntrack -L` lines as flows, in order; a line without both directions is no entry."""
    found = []
    for line in text.splitlines():
        fields = calc_pairs(line)
        if len(fields["src"]) == len(fields["dst"]) == 2:
            found.append(
                Flow(fields["src"][0], fields["dst"][0], fields["src"][1], fields["dst"][1])
            )
    return found


def calc_pairs(line: str) -> dict[str, list[str]]:
    """``src=`` / ``dst=`` values of one conntrack line, original direction first."""
    pairs: dict[str, list[str]] = {"src": [], "dst": []}
    for word in line.split():
        key, eq, value = word.partition("=")
        if eq and key in pairs:
            pairs[key].append(value)
    return pairs


def flush_conntrack(ns: Netns) -> None:
    for family in ("ipv4", "ipv6"):
        ns.run(["conntrack", "-F", "-f", family], check=False)


def node_addresses(ns: Netns) -> set[str]:
    """Every address a node namespace holds (what a masqueraded source may be)."""
    links = json.loads(ns.run(["ip", "-j", "addr"]).stdout)
    return {a["local"] for link in links for a in link.get("addr_info", ())}


def has_element(ns: Netns, family: int, name: str, ip: str) -> bool:
    """Whether the node's proxy table holds an element of map ``name`` keyed by ``ip``."""
    table = "ip6" if family == 6 else "ip"
    out = ns.run(["nft", "list", "map", table, "pycni-svc", name], check=False).stdout
    return ipaddress.ip_address(ip).compressed in out


def route_service_cidrs(ns: Netns, cidrs: tuple[str, ...]) -> None:
    """What a node's default route does: service VIPs are routed (out the underlay), so the
    filter hooks that refuse or drop see the packet."""
    for cidr in cidrs:
        flag = "-6" if ":" in cidr else "-4"
        ns.run(["ip", flag, "route", "add", cidr, "dev", "eth0"])

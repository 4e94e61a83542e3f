"""Purging existing connections that the policies now deny (``existingConnections: purge``).

By default a policy applies to new connections only: conntrack accepts an established one
before any policy rule (``render.py``). Under ``purge``, after each render the kernel took,
every TCP, UDP and SCTP conntrack entry with an end among this node's Pods is judged by the
model (``evaluate.evaluate`` on the original source, the reply source, the backend after
DNAT, and its port) and deleted when denied: the next packet of that flow is then a new
connection the table judges. An entry the model allows is left alone, so a change towards
"allow" never cuts anything. One ``conntrack -L`` per pass that changed the table: its cost
follows the node's connection count (a purge limited to the Pods whose allowed set shrank is
not done yet); one ``conntrack -D`` per connection shape, after the pass's waiting ADDs were
released (``sync.py``), so a long purge never holds an ADD.
The ``conntrack`` tool runs in pycnid's netns (the proxy's ``conntrack.py`` does the same).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kernel.conntrack import run_conntrack
from netpol.evaluate import PolicyInputs, evaluate

log = logging.getLogger("pycnid.netpol")
PROTOCOLS = {"tcp": "TCP", "udp": "UDP", "sctp": "SCTP"}


@dataclass(frozen=True)
class Flow:
    protocol: str  # tcp, udp, sctp
    src: str  # the original source
    dst: str  # the original destination (a ClusterIP before DNAT)
    sport: int
    dport: int
    backend: str  # the reply's source: the destination after DNAT
    backend_port: int

    def delete_args(self) -> list[str]:
        """``conntrack -D`` of every entry of this flow's connection shape: same ends, same
        destination port and backend, any source port. The verdict does not depend on the
        source port, so one process deletes all of a client's connections of that shape (a
        busy client holds many)."""
        return [
            "-D", "-p", self.protocol, "--orig-src", self.src, "--orig-dst", self.dst,
            "--dport", str(self.dport), "--reply-src", self.backend,
            "--reply-port-src", str(self.backend_port),
        ]  # fmt: skip


def parse_flows(listing: str) -> list[Flow]:
    """The established TCP/UDP/SCTP entries of ``conntrack -L`` text: the first
    src/dst/sport/dport of a line are the original direction's, the second src/sport the
    reply's."""
    flows = []
    for line in listing.splitlines():
        words = line.split()
        if not words or words[0] not in PROTOCOLS or not is_established(words):
            continue
        fields: dict[str, list[str]] = {}
        for item in words:
            name, sep, value = item.partition("=")
            if sep:
                fields.setdefault(name, []).append(value)
        try:
            flows.append(
                Flow(
                    words[0],
                    fields["src"][0],
                    fields["dst"][0],
                    int(fields["sport"][0]),
                    int(fields["dport"][0]),
                    fields["src"][1],
                    int(fields["sport"][1]),
                )
            )
        except (KeyError, IndexError, ValueError):
            continue
    return flows


def is_established(words: list[str]) -> bool:
    """What the table's ``ct state established`` accepts and a purge must cut: an entry that
    saw a reply (an ``[UNREPLIED]`` one's next packet is judged anyway) and, for TCP, not in
    TIME_WAIT or CLOSE (over: deleting the many a busy node holds cost a process each)."""
    if "[UNREPLIED]" in words:
        return False
    return words[0] != "tcp" or len(words) < 4 or words[3] not in ("TIME_WAIT", "CLOSE")


def calc_denied(inputs: PolicyInputs, node: str, flows: list[Flow]) -> list[Flow]:
    """The flows ``node`` now denies: the source's egress where the source is one of its
    Pods, the destination's ingress where the destination is (each node judges its ends,
    as its table does)."""
    local = {ip.split("/")[0] for p in inputs.pods if p.node == node for ip in p.ips}
    denied = []
    for flow in flows:
        if flow.src not in local and flow.backend not in local:
            continue
        verdict = evaluate(
            inputs, flow.src, flow.backend, PROTOCOLS[flow.protocol], flow.backend_port
        )
        if (flow.src in local and not verdict.egress.allowed) or (
            flow.backend in local and not verdict.ingress.allowed
        ):
            denied.append(flow)
    return denied


def purge_denied(inputs: PolicyInputs, node: str) -> int:
    """Delete the denied flows' entries, one ``conntrack -D`` per connection shape; how
    many flows."""
    denied = calc_denied(inputs, node, parse_flows(run_conntrack(["-L"], "netpol")))
    for args in dict.fromkeys(tuple(flow.delete_args()) for flow in denied):
        run_conntrack(list(args), "netpol")
    if denied:
        log.info("netpol: purged %d connection(s) the policies now deny", len(denied))
    return len(denied)

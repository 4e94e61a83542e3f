"""The anchor of the first-packet figure: the store's policies as a linear ruleset (the
shape of iptables-based policy engines: one rule after another), loaded with nft.

``table inet pycni-bench-linear``, one base chain at the forward hook (priority filter + 10,
pycni-netpol's): established packets accepted first, then one rule per (policy, ingress rule,
port) in the store's order, each ``ip daddr {the Pods the policy selects} ip saddr {its peers}
meta l4proto P th dport N accept`` (anonymous sets: what one iptables rule with ipsets
matches), every policy before the one that allows the measured pair, which comes last, then a
drop for the server. A new connection to the server walks every rule. What it leaves out, for
being the same cost per rule: egress rules, ``except`` of an ipBlock, named ports (a rule
without a port match). The Pods and peers come from NetworkPolicy's own model
(``netpol.evaluate.selects``, ``netpol.members.Members``) over the store's records.
"""

from __future__ import annotations

from netpol.evaluate import PolicyInputs, selects
from netpol.members import Members, addresses
from netpol.policy import NetworkPolicy, Peer, PolicyPort, Rule
from netpol.record import read_model
from store.base import Store

TABLE = "pycni-bench-linear"


def render_linear(store: Store, server_ip: str) -> str:
    """The script of the linear ruleset of every policy ``store`` holds."""
    inputs = read_model(store).inputs
    members = Members(inputs)
    ordered = sorted(inputs.policies, key=lambda p: p.namespace == "fp")  # the pair's last
    rules = [r for p in ordered for r in policy_rules(inputs, members, p)]
    hook = "type filter hook forward priority filter + 10; policy accept;"
    lines = [
        f"add table inet {TABLE}",
        f"add chain inet {TABLE} forward {{ {hook} }}",
        "ct state established,related accept",
        *rules,
        f"ip daddr {server_ip} drop",
    ]
    head, body = lines[:2], lines[2:]
    return "\n".join([*head, *(f"add rule inet {TABLE} forward {r}" for r in body)]) + "\n"


def policy_rules(inputs: PolicyInputs, members: Members, policy: NetworkPolicy) -> list[str]:
    if not policy.isolates("Ingress"):
        return []
    selected = sorted(
        {ip for pod in inputs.pods if selects(policy, pod) for ip in addresses(pod, 4)}
    )
    if not selected:
        return []
    target = f"ip daddr {{ {', '.join(selected)} }}"
    return [
        f"{target} {source}{port}accept".replace("  ", " ")
        for rule in policy.ingress
        for source in sources(members, policy, rule)
        for port in port_terms(rule.ports)
    ]


def sources(members: Members, policy: NetworkPolicy, rule: Rule) -> list[str]:
    """The rule's peers as one ``ip saddr`` set ([""]: every source; []: none)."""
    if not rule.peers:
        return [""]
    found = sorted({a for peer in rule.peers for a in peer_sources(members, policy, peer)})
    return [f"ip saddr {{ {', '.join(found)} }} "] if found else []


def peer_sources(members: Members, policy: NetworkPolicy, peer: Peer) -> list[str]:
    if peer.ip_block is not None:
        return [str(peer.ip_block.cidr)] if peer.ip_block.cidr.version == 4 else []
    return list(members.peer_addresses(policy, peer, 4))


def port_terms(ports: tuple[PolicyPort, ...]) -> list[str]:
    if not ports:
        return [" "]
    return [port_term(p) for p in ports]


def port_term(port: PolicyPort) -> str:
    proto = port.protocol.lower()
    if not isinstance(port.port, int):
        return f"meta l4proto {proto} "  # every port, or a named one (left out)
    span = f"{port.port}-{port.end_port}" if port.end_port else str(port.port)
    return f"meta l4proto {proto} th dport {span} "

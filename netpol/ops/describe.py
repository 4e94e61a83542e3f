"""A policy's selectors, peers, ports and rules as one line of text each (pure).

What ``pycni netpol show``, ``explain`` and ``trace`` print, and what their JSON carries as
``text`` next to the rule itself, so the two outputs say the same. The words follow the API:
``podSelector`` alone is Pods of the policy's namespace, ``namespaceSelector`` alone every Pod of
the namespaces it picks, both in one peer the Pods it picks in those namespaces.
"""

from __future__ import annotations

from netpol.policy import NetworkPolicy, Peer, PolicyPort, Rule
from netpol.selector import LabelSelector, Requirement


def requirement_text(req: Requirement) -> str:
    values = ",".join(req.values)
    return {
        "In": f"{req.key} in ({values})",
        "NotIn": f"{req.key} notin ({values})",
        "Exists": req.key,
        "DoesNotExist": f"!{req.key}",
    }[req.operator]


def selector_text(selector: LabelSelector) -> str:
    """kubectl's selector syntax; "" for the empty selector (it matches everything)."""
    parts = [f"{k}={v}" for k, v in selector.match_labels]
    return ",".join(parts + [requirement_text(r) for r in selector.expressions])


def pods_text(selector: LabelSelector | None) -> str:
    if selector is None or selector.empty:
        return "every Pod"
    return f"Pods {selector_text(selector)}"


def peer_text(policy: NetworkPolicy, peer: Peer) -> str:
    if peer.ip_block is not None:
        excepts = ",".join(map(str, peer.ip_block.excepts))
        return f"ipBlock {peer.ip_block.cidr}" + (f" except {excepts}" if excepts else "")
    if peer.namespace_selector is None:
        return f"{pods_text(peer.pod_selector)} in namespace {policy.namespace}"
    namespaces = (
        "every namespace"
        if peer.namespace_selector.empty
        else f"namespaces {selector_text(peer.namespace_selector)}"
    )
    return f"{pods_text(peer.pod_selector)} in {namespaces}"


def port_text(port: PolicyPort) -> str:
    if port.port is None:
        return f"{port.protocol} (every port)"
    if port.end_port is not None:
        return f"{port.protocol}/{port.port}-{port.end_port}"
    return f"{port.protocol}/{port.port}"


def rule_text(policy: NetworkPolicy, rule: Rule, direction: str) -> str:
    """``from|to PEERS on PORTS``; no peers: anywhere, no ports: every port."""
    word = "from" if direction == "Ingress" else "to"
    peers = " or ".join(peer_text(policy, p) for p in rule.peers) or "anywhere"
    ports = ", ".join(port_text(p) for p in rule.ports) or "every port"
    return f"{word} {peers} on {ports}"


def rules_of(policy: NetworkPolicy, direction: str) -> tuple[Rule, ...]:
    return policy.ingress if direction == "Ingress" else policy.egress


def describe_rules(policy: NetworkPolicy, direction: str) -> list[dict]:
    """Each rule of ``direction`` with its index, its text and itself as the API writes it."""
    key = "from" if direction == "Ingress" else "to"
    return [
        {"rule": index, "text": rule_text(policy, rule, direction), "spec": rule.to_dict(key)}
        for index, rule in enumerate(rules_of(policy, direction))
    ]


def describe_policy(policy: NetworkPolicy) -> dict:
    """The policy for people: whom it selects, what it isolates, its rules per direction
    (an isolated direction without rules allows nothing)."""
    return {
        "policy": policy.ref,
        "podSelector": selector_text(policy.pod_selector) or "<none>",
        "selects": pods_text(policy.pod_selector) + f" in namespace {policy.namespace}",
        "policyTypes": list(policy.policy_types),
        **{
            direction.lower(): describe_rules(policy, direction)
            for direction in policy.policy_types
        },
    }

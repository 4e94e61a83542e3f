"""`pycni netpol trace|explain`: the verdict of the store's NetworkPolicies and why.

Both judge with ``netpol.evaluate`` over ``netpol.record.read_model`` (the store's policies,
namespaces' labels, Pods and nodes), the model enforcement is built from. ``trace`` answers for
one connection, per direction: the Pod at that end (or that the address is no Pod, so no
policy applies), whether policies isolate it and which, the policy and rule that allow the
connection, or an exemption (a Pod to itself, its own node). The connection is judged after
Service DNAT: a Service VIP as ``--to`` is said to be one, and its backends are what to trace
(``pycni svc trace`` names them). ``explain`` lists, per direction, the policies isolating a
Pod and their rules.
"""

from __future__ import annotations

from typing import Any

from cni.spec.errors import InvalidConfig
from netpol.evaluate import Decision, PodInfo, PolicyInputs, evaluate, policies_of
from netpol.ops.describe import describe_rules, rule_text, rules_of
from netpol.record import read_model
from services.ops.trace import parse_endpoint, parse_target
from services.record import service_ip_key
from store.base import Store


def trace(store: Store, source: str, target: str) -> dict[str, Any]:
    src, src_port = parse_endpoint(source, "--from", need_port=False)
    dst, port, proto = parse_target(target)
    protocol = proto.upper()
    model = read_model(store)
    verdict = evaluate(model.inputs, str(src), str(dst), protocol, port)
    notes = []
    vip = store.get(service_ip_key(str(dst)))
    if vip is not None:
        notes.append(
            f"{dst} is a clusterIP of Service {vip.value.decode(errors='replace')}: policies "
            "judge its backends after DNAT (pycni svc trace names them; trace one of those)"
        )
    ends = {"Egress": (str(src), str(dst)), "Ingress": (str(dst), str(src))}
    return {
        "from": str(src) + (f":{src_port}" if src_port else ""),
        "to": f"{dst}:{port}/{protocol}",
        "allowed": verdict.allowed,
        **{
            d.direction.lower(): decision_doc(model.inputs, d, *ends[d.direction], protocol, port)
            for d in (verdict.egress, verdict.ingress)
        },
        "notes": notes,
        "unreadable": list(model.unreadable),
    }


def decision_doc(
    inputs: PolicyInputs, decision: Decision, at: str, peer: str, protocol: str, port: int
) -> dict[str, Any]:
    doc = decision.to_dict()
    by_ref = {p.ref: p for p in inputs.policies}
    doc["allowedBy"] = [
        {
            "policy": ref,
            "rule": index,
            "text": rule_text(
                by_ref[ref], rules_of(by_ref[ref], decision.direction)[index], decision.direction
            ),
        }
        for ref, index in decision.allowed_by
    ]
    doc["why"] = calc_why(decision, at, peer, protocol, port)
    return doc


def calc_why(decision: Decision, at: str, peer: str, protocol: str, port: int) -> str:
    direction = decision.direction.lower()
    if decision.pod is None:
        return f"{at} is no Pod in the store: no policy applies to its {direction}"
    if decision.exempt:
        return f"allowed: {decision.exempt}, whatever the policies say"
    if not decision.isolating:
        return (
            f"{decision.pod} is not isolated for {direction} (no policy selects it with "
            f"{decision.direction} in policyTypes): allowed"
        )
    isolating = ", ".join(decision.isolating)
    if decision.allowed_by:
        rules = "; ".join(f"{ref} {direction} rule {i}" for ref, i in decision.allowed_by)
        return f"{decision.pod} is isolated for {direction} by {isolating}; allowed by {rules}"
    word = "from" if decision.direction == "Ingress" else "to"
    return (
        f"denied: {decision.pod} is isolated for {direction} by {isolating}, and no rule of "
        f"them allows {protocol}/{port} {word} {peer}"
    )


def find_pod(inputs: PolicyInputs, namespace: str, name: str) -> PodInfo:
    pod = next((p for p in inputs.pods if p.ref == f"{namespace}/{name}"), None)
    if pod is None:
        raise InvalidConfig(
            f"no Pod {namespace}/{name} in the store (pycni-svc publishes a Pod it attaches "
            "with K8S_POD_NAMESPACE and K8S_POD_NAME)"
        )
    return pod


def explain(store: Store, namespace: str, name: str) -> dict[str, Any]:
    model = read_model(store)
    pod = find_pod(model.inputs, namespace, name)
    return {
        "pod": pod.ref,
        "ips": list(pod.ips),
        "labels": dict(pod.labels),
        "node": pod.node or None,
        "ports": [{"name": p.name, "protocol": p.protocol, "port": p.port} for p in pod.ports],
        **{d.lower(): direction_doc(model.inputs, pod, d) for d in ("Ingress", "Egress")},
        "unreadable": list(model.unreadable),
    }


def direction_doc(inputs: PolicyInputs, pod: PodInfo, direction: str) -> dict[str, Any]:
    policies = policies_of(inputs, pod, direction)
    return {
        "isolated": bool(policies),
        "policies": [{"policy": p.ref, "rules": describe_rules(p, direction)} for p in policies],
    }

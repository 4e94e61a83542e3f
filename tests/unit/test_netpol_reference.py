"""netpol/ against the reference model of NetworkPolicy v1 (tests/fixtures/netpol_reference.py,
written from types.go and the "Network Policies" page, independent of netpol/).

- Generated clusters and policies in the upstream conformance shape
  (tests/fixtures/netpol_cases.py): ``parse_policy`` + ``evaluate`` must allow exactly what the
  reference allows, for connections between Pods, nodes and outside addresses of one family.
- Generated valid manifests survive ``parse_policy(p.to_dict())``.
- Generated invalid manifests (one mutation into a valid one) raise ``InvalidConfig`` (code 7)
  naming the field path, never another exception.
- The upstream e2e cases (tests/fixtures/netpol_e2e.py): the reference's full matrix equals
  the e2e's expectation, and the implementation's equals the reference's.
- Fixed cases where netpol/ once departed from the definition (the API server's validation).

Case counts come from tests/fuzz/budget.py: ``PYCNI_FUZZ_PROFILE=fuzz`` runs 50 times more.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni.spec.errors import InvalidConfig
from netpol.evaluate import evaluate
from netpol.policy import parse_policy
from tests.fixtures import netpol_e2e as e2e
from tests.fixtures.netpol_cases import API, clusters, connections, inputs_of, manifests
from tests.fixtures.netpol_reference import Cluster, allowed
from tests.fuzz.budget import cases


def disagreement(cluster: Cluster, conn: tuple[str, str, str, int], verdict: Any) -> str:
    pods = [
        f"{p.namespace}/{p.name} {','.join(p.ips)} {dict(p.labels)} {p.node} {list(p.ports)}"
        for p in cluster.pods
    ]
    return (
        f"netpol says {verdict.allowed}, the reference {not verdict.allowed} for {conn}\n"
        f"verdict: {json.dumps(verdict.to_dict())}\npolicies: {json.dumps(cluster.policies)}\n"
        f"namespaces: {dict(cluster.namespaces)}\npods:\n  " + "\n  ".join(pods)
    )


@cases(150)
@given(st.data())
def test_evaluate_agrees_with_the_reference(data: st.DataObject) -> None:
    cluster = data.draw(clusters())
    inputs = inputs_of(cluster)
    rnd = data.draw(st.randoms(use_true_random=False))
    for conn in connections(cluster, rnd, 60):
        verdict = evaluate(inputs, *conn)
        assert verdict.allowed == allowed(cluster, *conn), disagreement(cluster, conn, verdict)


@cases(150)
@given(manifests())
def test_to_dict_parses_back_to_the_same_policy(manifest: dict[str, Any]) -> None:
    policy = parse_policy(manifest, "x")
    assert parse_policy(policy.to_dict(), "elsewhere") == policy


# --- invalid manifests: (mutation, path relative to where it lands) ------------------------

BAD_SELECTORS: tuple[tuple[Any, str], ...] = (
    (
        {"matchExpressions": [{"key": "app", "operator": "Equals", "values": ["a"]}]},
        ".matchExpressions[0].operator",
    ),
    (
        {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["a"]}]},
        ".matchExpressions[0].values",
    ),
    (
        {"matchExpressions": [{"key": "app", "operator": "DoesNotExist", "values": ["a"]}]},
        ".matchExpressions[0].values",
    ),
    (
        {"matchExpressions": [{"key": "app", "operator": "In", "values": []}]},
        ".matchExpressions[0].values",
    ),
    ({"matchExpressions": [{"key": "app", "operator": "NotIn"}]}, ".matchExpressions[0].values"),
    ({"matchExpressions": [{"key": "-app", "operator": "Exists"}]}, ".matchExpressions[0].key"),
    (
        {"matchExpressions": [{"key": "app", "operator": "In", "values": ["-a"]}]},
        ".matchExpressions[0].values[0]",
    ),
    ({"matchExpressions": ["app"]}, ".matchExpressions[0]"),
    ({"matchExpressions": {"key": "app"}}, ".matchExpressions"),
    ({"matchLabels": {"bad key": "a"}}, ".matchLabels"),
    ({"matchLabels": {"app": "-a-"}}, ".matchLabels"),
    ({"matchLabels": {"app": 5}}, ".matchLabels"),
    ({"matchLabels": ["app"]}, ".matchLabels"),
    ({"matchLabel": {"app": "a"}}, ".matchLabel"),
    ("app=a", ""),
    ([], ""),
)
BAD_PEERS: tuple[tuple[Any, str], ...] = (
    (
        ({"ipBlock": {"cidr": "10.0.0.0/24"}, "podSelector": {}}, ""),
        ({"ipBlock": {"cidr": "10.0.0.0/24"}, "namespaceSelector": {}}, ""),
        ({}, ""),
        ({"ipBlock": {"cidr": "10.0.0.0/24", "except": ["10.0.1.0/28"]}}, ".ipBlock.except[0]"),
        ({"ipBlock": {"cidr": "10.0.0.0/24", "except": ["10.0.0.0/24"]}}, ".ipBlock.except[0]"),
        ({"ipBlock": {"cidr": "10.0.0.0/24", "except": ["10.0.0.0/16"]}}, ".ipBlock.except[0]"),
        ({"ipBlock": {"cidr": "10.0.0.0/24", "except": ["fd00::/64"]}}, ".ipBlock.except[0]"),
        ({"ipBlock": {"cidr": "fd00::/64", "except": ["10.0.0.0/28"]}}, ".ipBlock.except[0]"),
        ({"ipBlock": {"cidr": "10.0.0.0/24", "except": ["10.0.0.0/24x"]}}, ".ipBlock.except[0]"),
        ({"ipBlock": {"cidr": "10.0.0.0/24", "except": "10.0.0.0/28"}}, ".ipBlock.except"),
        ({"ipBlock": {"cidr": "10.0.0.0"}}, ".ipBlock.cidr"),
        ({"ipBlock": {"cidr": "10.0.0.0/33"}}, ".ipBlock.cidr"),
        ({"ipBlock": {"cidr": 167772160}}, ".ipBlock.cidr"),
        ({"ipBlock": {}}, ".ipBlock.cidr"),
        ({"ipBlock": "10.0.0.0/24"}, ".ipBlock"),
        ("x", ""),
        (7, ""),
    )
    + tuple(({"podSelector": s}, ".podSelector" + p) for s, p in BAD_SELECTORS)
    + tuple(
        ({"namespaceSelector": s, "podSelector": {}}, ".namespaceSelector" + p)
        for s, p in BAD_SELECTORS
    )
)
BAD_PORTS: tuple[tuple[Any, str], ...] = (
    ({"port": 81, "endPort": 80}, ".endPort"),
    ({"port": "serve-80-tcp", "endPort": 81}, ".endPort"),
    ({"endPort": 81}, ""),  # the API names .port (required), netpol .endPort: either is fine
    ({"port": 80, "endPort": 70000}, ".endPort"),
    ({"port": 0}, ".port"),
    ({"port": 70000}, ".port"),
    ({"port": -1}, ".port"),
    ({"port": 80.5}, ".port"),
    ({"port": True}, ".port"),
    ({"port": "80"}, ".port"),
    ({"port": "Serve"}, ".port"),
    ({"port": "serve_80"}, ".port"),
    ({"port": "serve-80-tcp-longer"}, ".port"),
    ({"port": "-serve"}, ".port"),
    ({"protocol": "ICMP"}, ".protocol"),
    ({"protocol": "tcp"}, ".protocol"),
    ({"protocol": "TCP", "port": 80, "hostPort": 80}, ".hostPort"),
    ([], ""),
    ("80", ""),
)
BAD_RULES: tuple[tuple[Any, str], ...] = (
    ("x", ""),
    (5, ""),
    ({"PEERS": [], "peers": []}, ".peers"),
    ({"PEERS": {"podSelector": {}}}, ".PEERS"),
    ({"ports": {"port": 80}}, ".ports"),
)
BAD_TYPES: tuple[tuple[Any, str], ...] = (
    (["Ingress", "Foo"], "spec.policyTypes[1]"),
    (["ingress"], "spec.policyTypes[0]"),
    ([5], "spec.policyTypes[0]"),
    ([{}], "spec.policyTypes[0]"),
    ("Ingress", "spec.policyTypes"),
    (["Ingress", "Egress", "Ingress"], "spec.policyTypes"),
)


@st.composite
def invalid_manifests(draw: Any) -> tuple[dict[str, Any], str]:
    manifest = draw(manifests())
    spec = manifest["spec"]
    where = draw(st.sampled_from(("podSelector", "rule", "peer", "port", "types", "rules")))
    if where == "podSelector":
        # a falsy non-object here is accepted as {}: see test_falsy_non_objects_are_refused
        bad, path = draw(st.sampled_from([c for c in BAD_SELECTORS if c[0]]))
        spec["podSelector"] = bad
        return manifest, "spec.podSelector" + path
    if where == "types":
        spec["policyTypes"], path = draw(st.sampled_from(BAD_TYPES))
        return manifest, path
    key, peers_key = draw(st.sampled_from((("ingress", "from"), ("egress", "to"))))
    if where == "rules":
        spec[key] = draw(st.sampled_from(({"from": []}, "rules", 3)))
        return manifest, f"spec.{key}"
    rules = spec.get(key) or []
    at = f"spec.{key}[{len(rules)}]"
    if where == "rule":
        bad, path = draw(st.sampled_from(BAD_RULES))
        bad = json.loads(json.dumps(bad).replace("PEERS", peers_key))
        spec[key] = [*rules, bad]
        return manifest, at + path.replace("PEERS", peers_key)
    if where == "peer":
        bad, path = draw(st.sampled_from(BAD_PEERS))
        spec[key] = [*rules, {peers_key: [{"podSelector": {}}, bad]}]
        return manifest, f"{at}.{peers_key}[1]{path}"
    bad, path = draw(st.sampled_from(BAD_PORTS))
    spec[key] = [*rules, {"ports": [bad]}]
    return manifest, f"{at}.ports[0]{path}"


@cases(200)
@given(invalid_manifests())
def test_invalid_manifests_name_the_field(case: tuple[dict[str, Any], str]) -> None:
    manifest, path = case
    with pytest.raises(InvalidConfig) as raised:
        parse_policy(manifest, "x")
    assert raised.value.code == 7
    assert path in str(raised.value), f"expected {path!r} in {str(raised.value)!r}"


# --- the upstream e2e cases -----------------------------------------------------------------


@pytest.mark.parametrize("case", e2e.CASES, ids=[c.name for c in e2e.CASES])
def test_e2e_case_matrix(case: e2e.Case) -> None:
    cluster = e2e.cluster(case.policies)
    inputs = inputs_of(cluster)
    wrong = []
    for src in e2e.PODS:
        for dst in (d for d in e2e.PODS if d != src):
            for proto in case.protocols:
                for port in (80, 81):
                    cell = (e2e.ip_of(src), e2e.ip_of(dst), proto, port)
                    want = case.expect(src, dst, proto, port)
                    ref, got = allowed(cluster, *cell), evaluate(inputs, *cell).allowed
                    if not want == ref == got:
                        wrong.append(
                            f"{src}->{dst} {proto}/{port}: e2e {want} ref {ref} netpol {got}"
                        )
    assert not wrong, "\n".join(wrong[:12])


# --- where parse_policy departs from the API server (kubernetes pkg/apis/networking/validation,
# apimachinery validation, types.go); each case is the minimal manifest ----------------------


def manifest_with(spec: Any = None, name: str = "p") -> dict[str, Any]:
    doc: dict[str, Any] = {**API, "metadata": {"name": name, "namespace": "x"}}
    if spec is not None:
        doc["spec"] = spec
    return doc


def ingress_with(rule: dict[str, Any]) -> dict[str, Any]:
    return manifest_with({"podSelector": {}, "ingress": [rule]})


ACCEPTED_BY_THE_API = {
    # types.go: podSelector "is optional. If it is not specified, it defaults to an empty
    # selector"; spec itself is optional (omitempty), the same empty selector
    "podSelector absent": manifest_with({}),
    "spec absent": manifest_with(),
    # ValidateNetworkPolicyName = NameIsDNSSubdomain, not a DNS label
    "name a DNS subdomain": manifest_with({"podSelector": {}}, name="allow.web"),
    # ValidateNetworkPolicySpec checks len <= 2 and each value, never duplicates
    "policyTypes duplicated": manifest_with({"podSelector": {}, "policyTypes": ["Ingress"] * 2}),
}
REFUSED_BY_THE_API = {
    # IsValidPortName: "must not contain consecutive hyphens"
    "port name with --": ingress_with({"ports": [{"port": "serve--80"}]}),
    # netutils.ParseCIDRSloppy takes a prefix length only: no netmask, no zone
    "cidr with a netmask": ingress_with({"from": [{"ipBlock": {"cidr": "10.0.0.0/255.0.0.0"}}]}),
    "cidr with a zone": ingress_with({"from": [{"ipBlock": {"cidr": "fe80::%1/64"}}]}),
    # a qualified name's prefix is a DNS subdomain
    "label key prefix not a subdomain": manifest_with(
        {"podSelector": {"matchLabels": {"-a..b/k": "v"}}}
    ),
    # protocol given but empty: NotSupported (only nil defaults to TCP)
    "protocol empty": ingress_with({"ports": [{"protocol": ""}]}),
    # a wrong JSON type is a decoding error, even when falsy; netpol reads these as absent
    "from an empty object": ingress_with({"from": {}}),
    "ports an empty string": ingress_with({"ports": ""}),
    "except an empty string": ingress_with(
        {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ""}}]}
    ),
    "podSelector an empty list": manifest_with({"podSelector": []}),
    "matchLabels an empty list": manifest_with({"podSelector": {"matchLabels": []}}),
    "matchExpressions an empty object": manifest_with({"podSelector": {"matchExpressions": {}}}),
    # a YAML manifest can carry a non-string key: InvalidConfig, not TypeError from sorting
    "matchLabels with an int key among strings": manifest_with(
        {"podSelector": {"matchLabels": {"b": "c", 1: "a"}}}
    ),
}


@pytest.mark.parametrize("name", ACCEPTED_BY_THE_API)
def test_parse_accepts_what_the_api_accepts(name: str) -> None:
    parse_policy(ACCEPTED_BY_THE_API[name], "x")


@pytest.mark.parametrize("name", REFUSED_BY_THE_API)
def test_parse_refuses_what_the_api_refuses(name: str) -> None:
    with pytest.raises(InvalidConfig):
        parse_policy(REFUSED_BY_THE_API[name], "x")

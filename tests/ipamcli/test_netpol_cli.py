"""`pycni netpol` and `pycni ns` end to end on a SQLite store: apply (YAML, JSON, many
documents, Lists) reporting created/configured/unchanged, refusals naming the file, document
and field path that write nothing (the whole store compared), rm, ls, show, namespace labels,
and trace/explain over Pods published as pycni-svc publishes them (endpoint records), with
the policy and rule behind each answer."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from cli import cli
from nodes.record import NodeRecord, node_key
from services.proxy.config import DEFAULT_PROXY_CONFIG
from services.proxy.inputs import ProxyInputs
from services.record import EndpointRecord
from store.base import Put
from store.keys import proxy_inputs_key
from store.sqlite import SqliteStore

WEB = """\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from:
    - podSelector: {matchLabels: {app: client}}
    - namespaceSelector: {matchLabels: {team: ops}}
    ports: [{port: http}, {port: 9000, endPort: 9100}]
"""
DENY_EGRESS = """\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-egress}
spec:
  podSelector: {}
  policyTypes: [Egress]
"""
DNS = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "dns", "namespace": "shop"},
    "spec": {
        "podSelector": {
            "matchExpressions": [{"key": "app", "operator": "In", "values": ["db", "web"]}]
        },
        "ingress": [{"ports": [{"port": "dns", "protocol": "UDP"}]}],
    },
}


@pytest.fixture
def path(tmp_path) -> str:
    p = str(tmp_path / "store.db")
    SqliteStore(p).close()
    return p


@pytest.fixture
def store(path):
    s = SqliteStore(path)
    yield s
    s.close()


@pytest.fixture
def pycni(path):
    """`pycni ARGS` on the test's store: its JSON answer (``text``: its text), or with
    ``code`` its error output."""
    runner = CliRunner()

    def run(*args: str, code: int = 0, text: bool = False, stdin: str | None = None):
        output = [] if text or "-o" in args else ["-o", "json"]
        result = runner.invoke(cli, [*args, "--store-path", path, *output], input=stdin)
        assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
        assert "Traceback" not in result.output + result.stderr
        if code:
            return result.stderr
        return result.stdout if text or "-o" in args else json.loads(result.stdout)

    return run


def write(tmp_path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def snapshot(store) -> dict:
    return {kv.key: kv.value for kv in store.range("/")}


def publish(store, ns, pod, ip, labels, node="n1", ports=None, protocols=None) -> None:
    record = EndpointRecord(
        ns, pod, "eth0", (ip,), labels, node, ports or {}, port_protocols=protocols or {}
    )
    store.txn([], [Put(record.key, record.to_bytes())])


def test_apply_yaml_documents_reports_like_kubectl_and_stores_the_defaults(pycni, store, tmp_path):
    f = write(tmp_path, "p.yaml", WEB + "---\n" + DENY_EGRESS + "---\n")
    assert pycni("netpol", "apply", "-f", f)["applied"] == [
        {"policy": "shop/web", "result": "created"},
        {"policy": "default/deny-egress", "result": "created"},
    ]
    stored = json.loads(store.get("/pycni/v1/netpols/shop/web").value)
    assert stored["spec"]["policyTypes"] == ["Ingress"]
    assert stored["spec"]["ingress"][0]["ports"][0] == {"protocol": "TCP", "port": "http"}
    assert pycni("netpol", "apply", "-f", f, text=True).splitlines() == [
        "networkpolicy.networking.k8s.io/shop/web unchanged",
        "networkpolicy.networking.k8s.io/default/deny-egress unchanged",
    ]
    f = write(tmp_path, "p.yaml", WEB.replace("9100", "9200"))
    assert pycni("netpol", "apply", "-f", f)["applied"][0]["result"] == "configured"


def test_apply_json_a_list_and_stdin_with_a_namespace(pycni, store, tmp_path):
    f = write(tmp_path, "dns.json", json.dumps(DNS))
    assert pycni("netpol", "apply", "-f", f)["applied"][0]["result"] == "created"
    plain = {**DNS, "metadata": {"name": "dns"}}
    items = {"apiVersion": "v1", "kind": "List", "items": [plain, yaml.safe_load(DENY_EGRESS)]}
    done = pycni("netpol", "apply", "-f", "-", "-n", "team", stdin=yaml.safe_dump(items))
    assert [a["policy"] for a in done["applied"]] == ["team/dns", "team/deny-egress"]
    typed = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicyList", "items": [DNS]}
    f = write(tmp_path, "list.json", json.dumps(typed))
    assert pycni("netpol", "apply", "-f", f)["applied"] == [
        {"policy": "shop/dns", "result": "unchanged"}
    ]


BAD = [
    (
        WEB + "---\n" + WEB.replace("web", "w2").replace("9100", "8000"),
        "document 2: invalid NetworkPolicy field spec.ingress[0].ports[1].endPort",
    ),
    (
        WEB.replace("{port: http}", "{port: http, protocol: ICMP}"),
        "document 1: invalid NetworkPolicy field spec.ingress[0].ports[0].protocol",
    ),
    (
        WEB.replace(
            "- namespaceSelector", "  ipBlock: {cidr: 10.0.0.0/8}\n    - namespaceSelector"
        ),
        "spec.ingress[0].from[0]: may not specify more than 1 peer type",
    ),
    (
        WEB.replace("{matchLabels: {app: web}}", "{matchExpressions: [{key: a, operator: Is}]}"),
        "spec.podSelector.matchExpressions[0].operator",
    ),
    (WEB.replace("kind: NetworkPolicy", "kind: Service"), "document 1: invalid NetworkPolicy"),
    (WEB.replace("namespace: shop", "namespace: Shop"), "metadata.namespace"),
    ("apiVersion: v1\nkind: List\nitems: [{kind: NetworkPolicy}]", "document 1, items[0]"),
    ("spec: [\n", "not YAML or JSON at line 2"),
    ("{1: 2}", "key 1 is not a string"),
    ("# nothing\n", "no object in the file"),
    (WEB + "---\n" + WEB, "NetworkPolicy shop/web is also in"),
    (json.dumps({**DNS, "metadata": {"name": "dns\n"}}), "metadata.name: 'dns\\n'"),
]


@pytest.mark.parametrize("text, message", BAD)
def test_an_invalid_file_names_the_field_and_writes_nothing(pycni, store, tmp_path, text, message):
    pycni("netpol", "apply", "-f", write(tmp_path, "ok.yaml", DENY_EGRESS))
    before = snapshot(store)
    err = pycni("netpol", "apply", "-f", write(tmp_path, "bad.yaml", text), code=1)
    assert err.startswith("pycni netpol: ") and message in err, err
    assert "bad.yaml" in err and snapshot(store) == before


def test_a_namespace_other_than_the_manifests_is_refused(pycni, tmp_path):
    err = pycni("netpol", "apply", "-f", write(tmp_path, "w.yaml", WEB), "-n", "x", code=1)
    assert "metadata.namespace 'shop' does not match --namespace 'x'" in err


def test_rm_ls_show(pycni, store, tmp_path):
    pycni("netpol", "apply", "-f", write(tmp_path, "p.yaml", WEB + "---\n" + DENY_EGRESS))
    table = pycni("netpol", "ls", text=True).splitlines()
    assert table[0].split() == ["NAMESPACE", "NAME", "POD-SELECTOR", "POLICY-TYPES"]
    assert table[1].split() == ["default", "deny-egress", "<none>", "Egress"]
    assert table[2].split() == ["shop", "web", "app=web", "Ingress"]
    assert [p["name"] for p in pycni("netpol", "ls", "-n", "shop")["policies"]] == ["web"]
    manifest = pycni("netpol", "show", "shop/web", "-o", "json")
    assert json.loads(manifest)["metadata"] == {"namespace": "shop", "name": "web"}
    assert yaml.safe_load(pycni("netpol", "show", "shop/web", "-o", "yaml")) == json.loads(
        manifest
    )
    text = pycni("netpol", "show", "shop/web", text=True)
    assert (
        "rule 0: from Pods app=client in namespace shop or every Pod in namespaces team=ops "
        "on TCP/http, TCP/9000-9100" in text
    )
    assert pycni("netpol", "rm", "shop/web") == {"removed": "shop/web"}
    assert "no NetworkPolicy shop/web" in pycni("netpol", "rm", "shop/web", code=1)
    assert "no NetworkPolicy shop/web" in pycni("netpol", "show", "shop/web", code=1)
    assert "is not NAMESPACE/NAME" in pycni("netpol", "rm", "web", code=1)


def test_a_corrupt_record_is_skipped_and_named(pycni, store, tmp_path):
    pycni("netpol", "apply", "-f", write(tmp_path, "p.yaml", DENY_EGRESS))
    store.txn([], [Put("/pycni/v1/netpols/shop/bad", b'{"kind": "NetworkPolicy"}')])
    store.txn([], [Put("/pycni/v1/netpols/shop/moved", json.dumps(DNS).encode())])
    doc = pycni("netpol", "ls")
    assert [p["name"] for p in doc["policies"]] == ["deny-egress"]
    assert doc["unreadable"] == ["/pycni/v1/netpols/shop/bad", "/pycni/v1/netpols/shop/moved"]
    assert "corrupt NetworkPolicy record /pycni/v1/netpols/shop/bad" in pycni(
        "netpol", "show", "shop/bad", code=1
    )
    assert pycni("netpol", "rm", "shop/bad") == {"removed": "shop/bad"}


def test_ns_label_sets_removes_and_validates(pycni, store):
    doc = pycni("ns", "label", "shop", "team=ops", "tier=front")
    assert doc["labels"] == {
        "team": "ops",
        "tier": "front",
        "kubernetes.io/metadata.name": "shop",
    }
    assert json.loads(store.get("/pycni/v1/namespaces/shop").value) == {
        "labels": {"team": "ops", "tier": "front"}
    }
    assert "pass --overwrite" in pycni("ns", "label", "shop", "team=dev", code=1)
    assert pycni("ns", "label", "shop", "team=dev", "--overwrite")["labels"]["team"] == "dev"
    doc = pycni("ns", "label", "shop", "tier-", "gone-")
    assert "tier" not in doc["labels"] and doc["notFound"] == ["gone"]
    before = snapshot(store)
    for bad, why in [
        ("a b=c", "'a b' is not a label key"),
        ("team=x y", "'x y' is not a label value"),
        ("team", "expected key=value or key-"),
        ("kubernetes.io/metadata.name=x", "is the namespace's name"),
    ]:
        assert why in pycni("ns", "label", "shop", bad, code=1)
    assert "not a DNS label" in pycni("ns", "label", "Shop", "a=b", code=1)
    assert snapshot(store) == before
    publish(store, "web", "w1", "10.22.0.9", {"app": "web"})
    rows = {n["namespace"]: n for n in pycni("ns", "ls")["namespaces"]}
    assert rows["shop"]["labels"]["team"] == "dev" and rows["web"]["pods"] == 1
    assert pycni("ns", "show", "web")["pods"] == ["w1"]


@pytest.fixture
def cluster(pycni, store, tmp_path):
    """shop/web (app=web, named ports http TCP 8080 and dns UDP 53) on n1, shop/client and
    ops/probe on n2, the node records' addresses, and WEB + DNS + deny-egress in shop."""
    publish(store, "shop", "web", "10.22.0.9", {"app": "web"}, "n1", {"http": 8080, "dns": 53},
            {"dns": "UDP"})  # fmt: skip
    publish(store, "shop", "client", "10.22.1.5", {"app": "client"}, "n2")
    publish(store, "ops", "probe", "10.22.1.6", {"app": "probe"}, "n2")
    store.txn([], [Put(node_key("n1"), NodeRecord("n1", "192.0.2.1").to_bytes())])
    docs = [
        WEB,
        yaml.safe_dump(DNS),
        DENY_EGRESS.replace("deny-egress}", "deny-egress, namespace: shop}"),
    ]
    pycni("netpol", "apply", "-f", write(tmp_path, "c.yaml", "---\n".join(docs)))
    return pycni


def test_trace_names_the_policy_and_rule_or_why_it_is_denied(cluster):
    doc = cluster("netpol", "trace", "--from", "10.22.1.5", "--to", "10.22.0.9:8080/tcp")
    assert doc["allowed"] is False
    assert doc["egress"]["isolatingPolicies"] == ["shop/deny-egress"]
    assert "no rule of them allows TCP/8080 to 10.22.0.9" in doc["egress"]["why"]
    assert doc["ingress"]["allowedBy"] == [
        {
            "policy": "shop/web",
            "rule": 0,
            "text": "from Pods app=client in namespace shop or every Pod in namespaces "
            "team=ops on TCP/http, TCP/9000-9100",
        }
    ]
    doc = cluster("netpol", "trace", "--from", "10.22.1.6:4000", "--to", "10.22.0.9:8080")
    assert doc["allowed"] is False and doc["egress"]["pod"] == "ops/probe"
    assert doc["egress"]["isolated"] is False
    assert "isolated for ingress by shop/dns, shop/web" in doc["ingress"]["why"]
    cluster("ns", "label", "ops", "team=ops")
    text = cluster("netpol", "trace", "--from", "10.22.1.6", "--to", "10.22.0.9:8080", text=True)
    assert text.splitlines()[0] == "10.22.1.6 -> 10.22.0.9:8080/TCP: allowed"
    assert "allowed by shop/web ingress rule 0" in text


def test_trace_resolves_a_named_port_by_protocol_and_exempts_the_node(cluster):
    udp = cluster("netpol", "trace", "--from", "198.51.100.7", "--to", "10.22.0.9:53/udp")
    assert udp["allowed"] and udp["ingress"]["allowedBy"][0]["policy"] == "shop/dns"
    assert "198.51.100.7 is no Pod in the store" in udp["egress"]["why"]
    tcp = cluster("netpol", "trace", "--from", "198.51.100.7", "--to", "10.22.0.9:53/tcp")
    assert not tcp["allowed"]
    node = cluster("netpol", "trace", "--from", "192.0.2.1", "--to", "10.22.0.9:53/tcp")
    assert node["allowed"] and node["ingress"]["exempt"] == "from its own node"
    assert "invalid --to" in cluster("netpol", "trace", "--from", "1.2.3.4", "--to", "x", code=1)


def test_the_nodes_published_addresses_are_its_own_for_the_exemption(cluster, store):
    """kubelet probes a Pod from the node's address on the Pod's bridge (its gateway), which
    is in no node record: the addresses the node's proxy published are the node's too."""
    gateway = "10.22.0.1"
    denied = cluster("netpol", "trace", "--from", gateway, "--to", "10.22.0.9:53/tcp")
    assert not denied["allowed"]
    inputs = ProxyInputs((f"{gateway}/24", "192.0.2.1/24"), DEFAULT_PROXY_CONFIG, 1.0)
    store.txn([], [Put(proxy_inputs_key("n1"), inputs.to_bytes())])
    node = cluster("netpol", "trace", "--from", gateway, "--to", "10.22.0.9:53/tcp")
    assert node["allowed"] and node["ingress"]["exempt"] == "from its own node"


def test_trace_says_a_service_vip_is_one(cluster, store):
    store.txn([], [Put("/pycni/v1/serviceips/10.96.0.10", b"shop/web")])
    doc = cluster("netpol", "trace", "--from", "10.22.1.5", "--to", "10.96.0.10:80/tcp")
    assert "clusterIP of Service shop/web" in doc["notes"][0]


def test_explain_lists_the_policies_per_direction(cluster):
    doc = cluster("netpol", "explain", "shop/web")
    assert doc["ports"] == [
        {"name": "dns", "protocol": "UDP", "port": 53},
        {"name": "http", "protocol": "TCP", "port": 8080},
    ]
    assert [p["policy"] for p in doc["ingress"]["policies"]] == ["shop/dns", "shop/web"]
    assert doc["egress"]["policies"] == [{"policy": "shop/deny-egress", "rules": []}]
    text = cluster("netpol", "explain", "ops/probe", text=True)
    assert "ingress: not isolated" in text and "egress: not isolated" in text
    text = cluster("netpol", "explain", "shop/web", text=True)
    assert "rule 0: from anywhere on UDP/dns" in text and "(no rules: nothing allowed)" in text
    assert "no Pod shop/nope in the store" in cluster("netpol", "explain", "shop/nope", code=1)

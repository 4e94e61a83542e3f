"""`pycni netpol apply` on generated files: JSON values of any shape, valid manifests with one
field replaced by junk, and bytes that are neither, written as JSON or YAML. Each run either
succeeds or ends with one clean error line (exit 1, no traceback, no internal error) and
leaves the store as it was."""

from __future__ import annotations

import json
import os

import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli import cli
from store.sqlite import SqliteStore

SCALARS = st.none() | st.booleans() | st.integers(-70000, 70000) | st.text(max_size=12)
JUNK = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
WORDS = st.sampled_from(
    ["podSelector", "ingress", "egress", "from", "to", "ports", "port", "endPort", "protocol",
     "ipBlock", "cidr", "except", "namespaceSelector", "matchLabels", "matchExpressions",
     "key", "operator", "values", "policyTypes", "In", "Exists", "TCP", "UDP", "10.0.0.0/8",
     "app", "web", "http"]
)  # fmt: skip
FIELDS = st.recursive(
    SCALARS | WORDS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(WORDS, inner, max_size=3),
    max_leaves=15,
)
VALID = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "p", "namespace": "shop"},
    "spec": {
        "podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 80}]}],
    },
}


@st.composite
def manifests(draw) -> object:
    """A valid manifest with its spec (or one rule, or metadata) replaced by generated fields."""
    doc = json.loads(json.dumps(VALID))
    where = draw(st.sampled_from(["spec", "rule", "metadata", "name", "whole"]))
    value = draw(FIELDS)
    if where == "spec":
        doc["spec"] = value
    elif where == "rule":
        doc["spec"]["ingress"][0] = value
    elif where == "metadata":
        doc["metadata"] = value
    elif where == "name":
        doc["metadata"]["name"] = value
    else:
        return draw(JUNK)
    return doc


def render(docs: list, as_yaml: bool) -> str:
    if as_yaml:
        return yaml.safe_dump_all(docs)
    return json.dumps(
        docs[0] if len(docs) == 1 else {"apiVersion": "v1", "kind": "List", "items": docs}
    )


FILES = st.one_of(
    st.builds(render, st.lists(manifests(), min_size=1, max_size=3), st.booleans()),
    st.text(max_size=200),
)


@settings(
    max_examples=int(os.environ.get("PYCNI_NETPOL_EXAMPLES", "60")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(FILES)
def test_apply_succeeds_or_fails_cleanly_writing_nothing(tmp_path, text):
    path = str(tmp_path / "store.db")  # one store for every example: each compares its own
    SqliteStore(path).close()
    manifest = tmp_path / "m.yaml"
    manifest.write_text(text)
    store = SqliteStore(path)
    try:
        before = {kv.key: kv.value for kv in store.range("/")}
        result = CliRunner().invoke(
            cli, ["netpol", "apply", "-f", str(manifest), "--store-path", path, "-o", "json"]
        )
        after = {kv.key: kv.value for kv in store.range("/")}
    finally:
        store.close()
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code in (0, 1), (result.exit_code, result.stderr)
    assert "Traceback" not in result.output and "internal error" not in result.stderr, (
        result.stderr
    )
    if result.exit_code:
        assert result.stderr.startswith("pycni netpol: ") and after == before
    else:  # what changed is what it applied, and all of that is there
        applied = {
            f"/pycni/v1/netpols/{a['policy']}" for a in json.loads(result.stdout)["applied"]
        }
        assert {k for k in after if after[k] != before.get(k)} <= applied <= set(after)

"""What a node's Service proxy publishes for `pycni svc trace --node` on another node
(``services.proxy.inputs.ProxyInputs``): its settings read back as the config they came from,
any stored value reads as inputs or as a corrupt record naming its key (generated input), the
tracer asked about another node traces on what that node published (its addresses, its
masqueradeAll) and says so, and forgetting a node removes them."""

from __future__ import annotations

import ipaddress
import json

from hypothesis import given
from hypothesis import strategies as st

from nodes.reaper import forget_node
from nodes.record import NodeRecord, node_key
from services.ops.trace import trace
from services.proxy.config import ProxyConfig, parse_proxy_config, render_proxy_settings
from services.proxy.inputs import ProxyInputs
from services.record import EndpointRecord, ServicePort, ServiceRecord, ServiceSettings
from store.base import Put
from store.codec import encode
from store.keys import SERVICES_META, pool_key, proxy_inputs_key
from store.sqlite import SqliteStore
from tests.fixtures.records import assert_reads_or_corrupt

CIDRS = st.sampled_from(["10.0.0.0/8", "192.168.0.0/16", "fd00::/64", "2001:db8::/32"])
CONFIGS = st.builds(
    ProxyConfig,
    node_port_cidrs=st.none()
    | st.lists(CIDRS, min_size=1, max_size=3, unique=True).map(
        lambda c: tuple(ipaddress.ip_network(n) for n in c)
    ),
    masquerade_all=st.booleans(),
    local_bridge=st.none() | st.sampled_from(["cni0", "br-", "pycni0"]),
) | st.just(ProxyConfig(node_port_primary=True))


@given(CONFIGS)
def test_published_settings_read_back_as_the_config_they_came_from(config):
    assert parse_proxy_config({"services": {"proxy": True, **render_proxy_settings(config)}}) == (
        config
    )
    inputs = ProxyInputs(("192.168.0.2", "fd01::2"), config, 1.7e9)
    assert ProxyInputs.from_bytes("/k", inputs.to_bytes()) == inputs


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "addresses": JSON | st.lists(st.sampled_from(["10.0.0.1", "fd00::1"])),
        "settings": JSON
        | st.fixed_dictionaries({}, optional={"masqueradeAll": JSON, "nodePortAddresses": JSON}),
        "at": JSON,
    },
)


@given(FIELDS | JSON | st.binary(max_size=40))
def test_any_stored_value_reads_as_inputs_or_a_corrupt_record_naming_its_key(value):
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    assert_reads_or_corrupt(ProxyInputs, "/pycni/v1/proxyinputs/n2", raw)


def setup_store(tmp_path) -> SqliteStore:
    """n2 (record address 192.168.0.3) and a NodePort Service with one backend on n1."""
    store = SqliteStore(str(tmp_path / "store.db"))
    svc = ServiceRecord(
        "default",
        "web",
        "NodePort",
        (ServicePort("http", "TCP", 80, 8080, 30080),),
        ("10.96.0.10",),
        (),
        {"app": "web"},
    )
    pod = EndpointRecord("default", "web-0", "eth0", ("10.0.0.2",), {"app": "web"}, "n1")
    store.txn(
        [],
        [
            Put(SERVICES_META, ServiceSettings(("10.96.0.0/16",)).to_bytes()),
            Put(pool_key("pods"), encode({"cidr": "10.0.0.0/16"})),
            Put(node_key("n2"), NodeRecord("n2", "192.168.0.3").to_bytes()),
            Put(svc.key, svc.to_bytes()),
            Put(pod.key, pod.to_bytes()),
        ],
    )
    return store


def test_another_nodes_trace_uses_what_its_proxy_published(tmp_path):
    store = setup_store(tmp_path)
    second = "192.168.1.3"  # an address of n2 its node record does not name
    unpublished = trace(store, "n2", "203.0.113.9", f"{second}:30080/tcp")
    assert unpublished["inputs"]["source"] == "node-record"
    assert unpublished["answer"]["verdict"] == "accept"  # the record's address only
    pod = trace(store, "n2", "10.0.1.5", "10.96.0.10:80/tcp")["answer"]
    assert [c["masquerade"] for c in pod["choices"]] == [False]

    config = ProxyConfig(masquerade_all=True)
    inputs = ProxyInputs(("192.168.0.3", second), config, 1.7e9)
    store.txn([], [Put(proxy_inputs_key("n2"), inputs.to_bytes())])
    doc = trace(store, "n2", "203.0.113.9", f"{second}:30080/tcp")
    assert doc["inputs"] == {
        "source": "published",
        "at": 1.7e9,
        "settings": {"masqueradeAll": True},
    }
    assert (doc["answer"]["entry"], doc["answer"]["verdict"]) == ("NodePort", "dnat")
    assert second in doc["nodeIPs"]
    pod = trace(store, "n2", "10.0.1.5", "10.96.0.10:80/tcp")["answer"]
    assert [list(c["why"]) for c in pod["choices"]] == [["masqueradeAll"]]

    here = trace(store, "n2", "203.0.113.9", f"{second}:30080/tcp", local=(), config=None)
    assert here["inputs"]["source"] == "local" and here["answer"]["verdict"] == "accept"


def test_forgetting_a_node_removes_what_its_proxy_published(tmp_path):
    store = setup_store(tmp_path)
    inputs = ProxyInputs(("192.168.0.3",), ProxyConfig(), 1.7e9)
    store.txn([], [Put(proxy_inputs_key("n2"), inputs.to_bytes())])
    forget_node(store, "n2", [])
    assert store.get(proxy_inputs_key("n2")) is None and store.get(node_key("n2")) is None

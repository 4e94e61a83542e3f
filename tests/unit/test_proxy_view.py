"""The store's Service records as the proxy's model (services/proxy/view.py), the UDP conntrack
cleanup's pure parts, and `pycni svc trace` over a real SQLite store.

Generated clusters of Services and endpoints keep the view's invariants: a backend is an
address of the family, of an endpoint in the Service's namespace whose labels hold the
selector, ``local`` exactly when it is on the rendered node; a Service is in a family's table
exactly when it has a VIP of that family; node IPs are never loopback nor a Pod pool's."""

from __future__ import annotations

import ipaddress
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni.spec.errors import InvalidConfig
from nodes.record import NodeRecord
from services.ops.edit import create, set_settings
from services.ops.trace import parse_endpoint, parse_target, trace
from services.proxy.config import parse_proxy_config
from services.proxy.conntrack import calc_checks, calc_stale, calc_udp_serving, parse_flows
from services.proxy.elements import _text
from services.proxy.model import ServicePortView
from services.proxy.view import Records, calc_model, calc_node_ips, parse_address
from services.record import EndpointRecord, ServicePort, ServiceRecord, ServiceSettings
from store.base import KV, Put
from store.codec import encode
from store.keys import ENDPOINTS, NODES, SERVICE_IPS, SERVICES_META, pool_key
from store.sqlite import SqliteStore

NODES_ = ("n1", "n2")
LABELS = st.dictionaries(st.sampled_from(["app", "tier"]), st.sampled_from(["a", "b"]), max_size=2)
V4 = st.integers(2, 250).map(lambda i: f"10.0.{i % 3}.{i}")
V6 = st.integers(2, 250).map(lambda i: f"fd00::{i:x}")


def kv(key: str, value: bytes) -> KV:
    return KV(key, value, 1, 1)


@st.composite
def endpoints(draw) -> EndpointRecord:
    pod = draw(st.text("abc", min_size=1, max_size=3))
    ips = draw(st.lists(V4 | V6, min_size=1, max_size=2, unique=True))
    return EndpointRecord(
        draw(st.sampled_from(["ns", "other"])),
        pod,
        "eth0",
        tuple(ips),
        draw(LABELS),
        draw(st.sampled_from(NODES_)),
        draw(st.dictionaries(st.just("web"), st.integers(1, 9000))),
    )


@st.composite
def services(draw, name: str) -> ServiceRecord:
    vips = draw(st.lists(st.sampled_from(["10.96.0.5", "fd96::5"]), max_size=2, unique=True))
    ports = (
        ServicePort("http", "TCP", 80, draw(st.sampled_from([8080, "web"])), 30080),
        ServicePort("dns", "UDP", 53, 53),
    )
    return ServiceRecord(
        "ns",
        name,
        draw(st.sampled_from(["ClusterIP", "NodePort"])),
        ports,
        tuple(vips),
        (),
        draw(LABELS),
        draw(st.sampled_from(["None", "ClientIP"])),
    )


def records_of(svcs, eps, address: str = "192.168.0.2") -> Records:
    records = Records()
    for svc in svcs:
        records.apply(kv(svc.key, svc.to_bytes()))
    for ep in eps:
        records.apply(kv(ep.key, ep.to_bytes()))
    records.apply(kv(pool_key("pods"), encode({"cidr": "10.0.0.0/16"})))
    records.apply(kv(pool_key("net"), encode({"cidr": "10.9.0.0/16", "source": "netconf"})))
    records.apply(kv(SERVICES_META, ServiceSettings(("10.96.0.0/16",)).to_bytes()))
    records.apply(kv(f"{NODES}n1", NodeRecord("n1", address).to_bytes()))
    return records


@settings(max_examples=150, deadline=None)
@given(
    svcs=st.lists(
        st.sampled_from("abc").flatmap(services), max_size=3, unique_by=lambda s: s.name
    ),
    eps=st.lists(endpoints(), max_size=6, unique_by=lambda e: e.key),
    family=st.sampled_from([4, 6]),
)
def test_the_model_holds_what_the_records_select(svcs, eps, family):
    model = calc_model(records_of(svcs, eps), "n1", family)
    with_vip = {
        s.name
        for s in svcs
        if any(ipaddress.ip_address(v).version == family for v in s.cluster_ips)
    }
    assert {v.service.name for v in model.ports} == with_vip
    for view in model.ports:
        # each address and port once: what the checked constructor would keep of them
        assert view == ServicePortView(view.service, view.port, view.backends)
        svc = next(s for s in svcs if s.name == view.service.name)
        for b in view.backends:
            owner = [e for e in eps if str(b.ip) in e.ips and e.node == b.node]
            assert b.ip.version == family and b.local == (b.node == "n1") and owner
            assert any(
                e.namespace == "ns"
                and svc.selector
                and all(e.labels.get(k) == v for k, v in svc.selector.items())
                for e in owner
            )
        assert (view.port.node_port is not None) == (
            svc.type == "NodePort" and view.port.protocol == "tcp"
        )
    assert model.node.cluster_cidrs == (
        (ipaddress.ip_network("10.0.0.0/16"),) if family == 4 else ()
    )
    assert model.node.node_ips == ((ipaddress.ip_address("192.168.0.2"),) if family == 4 else ())


def test_an_address_two_nodes_claim_is_one_backend_the_last_nodes_in_address_order():
    """Two endpoint records with one address and port (a Pod moved, its old record not yet
    gone): one backend, at the address's place, on the node that sorts last."""
    port = ServicePort("http", "TCP", 80, 8080)
    svc = ServiceRecord(
        "ns", "a", ports=(port,), cluster_ips=("10.96.0.5",), selector={"app": "a"}
    )
    eps = [
        EndpointRecord("ns", pod, "eth0", (ip,), {"app": "a"}, node)
        for pod, ip, node in [
            ("p1", "10.0.0.9", "n2"),
            ("p2", "10.0.0.9", "n1"),
            ("p3", "10.0.0.3", "n2"),
        ]
    ]
    (view,) = calc_model(records_of([svc], eps), "n1", 4).ports
    assert [(str(b.ip), b.node, b.local) for b in view.backends] == [
        ("10.0.0.3", "n2", False),
        ("10.0.0.9", "n2", False),
    ]


SELECTORS = st.sampled_from([{}, {"app": "a"}, {"tier": "b"}, {"app": "a", "tier": "b"}])


@st.composite
def crowded_endpoints(draw) -> list[EndpointRecord]:
    """10-24 endpoints over few label sets, most in ``ns``: one label pair often picks more
    than ``SMALL`` of them (its index entry a set, a sorted tuple below that)."""
    pods = draw(st.lists(st.text("abcdefghijk", min_size=1, max_size=2), min_size=10,
                         max_size=24, unique=True))  # fmt: skip
    return [
        EndpointRecord(
            draw(st.sampled_from(["ns", "ns", "ns", "other"])),
            pod,
            "eth0",
            (f"10.0.{i // 200}.{i % 200 + 2}",),
            draw(SELECTORS),
            draw(st.sampled_from(NODES_)),
        )
        for i, pod in enumerate(pods)
    ]


@settings(max_examples=150)
@given(
    selectors=st.lists(SELECTORS, min_size=1, max_size=4),
    eps=crowded_endpoints(),
    gone=st.sets(st.integers(0, 23), max_size=12),
)
def test_a_service_selects_every_endpoint_its_selector_holds_in_key_order(selectors, eps, gone):
    """``Records.selected`` against a scan of every endpoint, with endpoints enough under one
    label pair that its index entry grows past a sorted tuple into a set and, with deletes,
    back (the entry's form decides how the selection is read)."""
    svcs = [
        ServiceRecord("ns", f"s{i}", "ClusterIP", (ServicePort("http", "TCP", 80, 8080),),
                      ("10.96.0.5",), (), selector, "None")
        for i, selector in enumerate(selectors)
    ]  # fmt: skip
    records = records_of(svcs, eps)
    for i in sorted(gone):
        if i < len(eps):
            records.apply(kv(eps[i].key, b""), deleted=True)
    live = [e for i, e in enumerate(eps) if i not in gone]
    for svc in svcs:
        picked = records.selected(svc)
        expected = sorted(
            (
                e
                for e in live
                if e.namespace == svc.namespace
                and svc.selector
                and all(e.labels.get(k) == v for k, v in svc.selector.items())
            ),
            key=lambda e: e.key,
        )
        assert [e.key for e, _ in picked] == [e.key for e in expected]
        assert all(ips == records.addresses[e.key] for e, ips in picked)


@settings(max_examples=100, deadline=None)
@given(eps=st.lists(endpoints(), max_size=6, unique_by=lambda e: e.key))
def test_deletes_and_snapshots_leave_exactly_the_live_records(eps):
    records = records_of([], eps)
    for ep in eps[::2]:
        records.apply(kv(ep.key, b""), deleted=True)
    assert set(records.endpoints) == {e.key for e in eps[1::2]}
    records.replace_all([kv(e.key, e.to_bytes()) for e in eps[:1]], ENDPOINTS)
    assert set(records.endpoints) == {e.key for e in eps[:1]}
    records.apply(kv(f"{NODES}bad", b"{not json"))
    assert "bad" not in records.nodes and f"{NODES}bad" in records.bad


@given(
    addrs=st.lists(V4 | V6 | st.sampled_from(["127.0.0.1", "::1", "fe80::1", "x"]), max_size=6),
    family=st.sampled_from([4, 6]),
)
def test_node_ips_are_never_loopback_link_local_or_a_pod_pool(addrs, family):
    ips = calc_node_ips(family, "192.168.0.2", addrs, ["10.0.1.0/24"])
    assert all(
        ip.version == family
        and not ip.is_loopback
        and not ip.is_link_local
        and ip not in ipaddress.ip_network("10.0.1.0/24")
        for ip in ips
    )


FLOW = st.tuples(
    st.sampled_from(["10.96.0.5", "10.96.0.6", "fd96::5"]), st.sampled_from([53, 5353]), V4 | V6
)


@given(flows=st.lists(FLOW, max_size=8), serving=st.sets(V4 | V6, max_size=3))
def test_one_listing_finds_every_flow_and_the_stale_ones_are_the_unserved(flows, serving):
    text = "".join(
        f"udp 17 29 src=10.1.1.1 dst={dst} sport=5 dport={port} [UNREPLIED] "
        f"src={src} dst=10.1.1.1 sport={port} dport=5 mark=0 use=1\n"
        for dst, port, src in flows
    )
    parsed = parse_flows(text + "conntrack v1.4.7: 3 flow entries\n")
    assert parsed == [((dst, port), src) for dst, port, src in flows]
    checks = {("10.96.0.5", 53): frozenset(serving), ("fd96::5", 5353): frozenset()}
    assert calc_stale(checks, parsed) == sorted(
        {((d, p), s) for d, p, s in flows if (d, p) in checks and s not in checks[(d, p)]}
    )


def test_only_changed_udp_entry_points_are_cleaned_but_all_after_a_full_render():
    a = records_of(
        [
            ServiceRecord(
                "ns",
                "d",
                "NodePort",
                (ServicePort("dns", "UDP", 53, 53, 30053),),
                ("10.96.0.5",),
                selector={"app": "a"},
            )
        ],
        [],
    )
    empty = calc_model(a, "n1", 4)
    ep = EndpointRecord("ns", "p", "eth0", ("10.0.0.7",), {"app": "a"}, "n2")
    a.apply(kv(ep.key, ep.to_bytes()))
    one = calc_model(a, "n1", 4)
    before, after = calc_udp_serving(empty), calc_udp_serving(one)
    assert after == {("10.96.0.5", 53): {"10.0.0.7"}, ("192.168.0.2", 30053): {"10.0.0.7"}}
    assert calc_checks(before, after, False) == after  # 0 -> 1: both cleaned
    assert calc_checks(after, after, False) == {} and calc_checks(after, after, True) == after


def spellings(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> st.SearchStrategy[str]:
    """Texts that name ``ip``: Python's compressed form, the exploded form, upper case, with
    a prefix length, as records may carry them."""
    forms = [str(ip), ip.exploded, ip.exploded.upper(), f"{ip}/{ip.max_prefixlen}"]
    return st.sampled_from(forms)


@settings(max_examples=300)
@given(text=st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).flatmap(spellings))
def test_a_parsed_address_keeps_the_text_the_c_formatter_gives_whatever_its_spelling(text):
    """The render writes ``ip.text``: it must be what ``_text`` formats for an address that
    carries none (a plain ``ipaddress`` one), for the same address."""
    ip = parse_address(text)
    plain = ipaddress.ip_address(text.split("/")[0])
    assert ip == plain
    assert ip.text == _text(plain)
    assert _text(ip) is ip.text


@given(ip=V4 | V6, port=st.integers(1, 65535), proto=st.sampled_from(["tcp", "udp", "sctp"]))
def test_trace_targets_parse_back(ip, port, proto):
    text = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
    assert parse_target(f"{text}/{proto.upper()}") == (ipaddress.ip_address(ip), port, proto)
    assert parse_endpoint(ip, "--from", need_port=False) == (ipaddress.ip_address(ip), 0)


@pytest.mark.parametrize(
    "text", ["10.96.0.5", "10.96.0.5:0/tcp", "x:80", "10.96.0.5:80/icmp", "10.96.0.5:99999"]
)
def test_bad_trace_targets_are_code_7_naming_the_option(text):
    with pytest.raises(InvalidConfig, match="--to") as info:
        parse_target(text)
    assert info.value.code == 7


def test_trace_over_the_store_names_the_selected_backends():
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(f"{tmp}/store.db")
        set_settings(store, ["10.96.0.0/24"], "30000-30100")
        create(
            store,
            {
                "namespace": "ns",
                "name": "web",
                "selector": {"app": "web"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
            },
        )
        for i, node in ((2, "n1"), (3, "n2")):
            ep = EndpointRecord("ns", f"p{i}", "eth0", (f"10.0.0.{i}",), {"app": "web"}, node)
            store.txn([], [Put(ep.key, ep.to_bytes())])
        store.txn([], [Put(f"{NODES}n1", NodeRecord("n1", "192.168.0.2").to_bytes())])
        vip = next(iter(store.range(SERVICE_IPS))).key.rsplit("/", 1)[1]
        doc = trace(store, "n1", "10.0.0.9", f"{vip}:80/tcp")
        assert doc["answer"]["verdict"] == "dnat"
        assert {(c["ip"], c["node"]) for c in doc["answer"]["choices"]} == {
            ("10.0.0.2", "n1"),
            ("10.0.0.3", "n2"),
        }
        with pytest.raises(InvalidConfig, match="--node"):
            trace(store, "n9", "10.0.0.9", f"{vip}:80/tcp")
        store.close()


@given(
    section=st.none()
    | st.integers()
    | st.dictionaries(
        st.sampled_from(["proxy", "resyncInterval"]),
        st.booleans() | st.integers(-5, 100) | st.floats() | st.text(max_size=2),
    )
)
def test_the_services_section_is_a_config_or_code_7_naming_the_key(section):
    raw = {} if section is None else {"services": section}
    try:
        config = parse_proxy_config(raw)
    except InvalidConfig as exc:
        assert exc.code == 7 and "'services" in str(exc)
        return
    on = isinstance(section, dict) and section.get("proxy") is True
    assert (config is not None) == on
    if config is not None:
        assert config.resync_interval > 0


@settings(max_examples=100, deadline=None)
@given(
    eps=st.lists(
        st.tuples(V4, st.sampled_from(["shared", "own", "none"]), st.sampled_from(NODES_)),
        min_size=1,
        max_size=8,
        unique_by=lambda e: e[0],
    )
)
def test_a_named_target_port_is_each_endpoints_own_port_shared_mapping_or_not(eps):
    """Endpoints sharing one named-ports mapping (a slice's, ``shared_ports``), endpoints with
    one each, and endpoints that do not name the port: each backend takes its own endpoint's
    port for the name, and an endpoint without it is no backend of that port."""
    shared = {"web": 8080}
    records = Records()
    port = ServicePort("http", "TCP", 80, "web")
    selector = {"app": "a"}
    records.put_service(
        "s", ServiceRecord("ns", "s", ports=(port,), cluster_ips=("10.96.0.5",), selector=selector)
    )
    expected = set()
    for i, (ip, kind, node) in enumerate(eps):
        ports = {"shared": shared, "own": {"web": 9000 + i}, "none": {}}[kind]
        records.put_endpoint(
            f"e{i}", EndpointRecord("ns", f"p{i}", "eth0", (ip,), selector, node, ports)
        )
        if ports:
            expected.add((ip, ports["web"], node))
    (view,) = calc_model(records, "n1", 4).ports
    assert {(str(b.ip), b.port, b.node) for b in view.backends} == expected

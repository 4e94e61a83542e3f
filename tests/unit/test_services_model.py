"""Services' pure parts over generated input: any input spec is a record or a code-7 error naming
a field (nothing else), a valid record's own spec validates back to it, the record codecs
round-trip keeping unknown fields, `--port` text is a spec port or a refusal naming --port,
and a selector picks exactly the endpoints whose labels hold all its pairs."""

from __future__ import annotations

import ipaddress
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.command import Failed
from cli.svc import parse_port
from cni.spec.errors import CNIError, InvalidConfig
from services.record import (
    EndpointRecord,
    ServicePort,
    ServiceRecord,
    ServiceSettings,
    service_key,
)
from services.selectors import calc_endpoints, matches
from services.validate import SPEC_FIELDS, validate_service, validate_settings
from store.codec import CorruptRecord

SETTINGS = settings(max_examples=400, deadline=None, database=None)
CONFIG = ServiceSettings(("10.96.0.0/24", "fd00:96::/120"), (30000, 30100))
FIELD = re.compile(r"^invalid Service field (\w+)(\[\d+\](\.\w+)?|\.\S+)?: ")

wild = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 70000),
    st.text(max_size=6),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
names = st.sampled_from(["", "http", "dns", "Bad_Name", "a" * 16, "metrics"])
numbers = st.one_of(st.sampled_from([0, 1, 80, 65535, 65536, -1, 30000, 30100, 30101]), wild)
ips = st.sampled_from(
    [
        "10.96.0.5",
        "10.96.0.0",
        "10.96.0.255",
        "10.97.0.1",
        "fd00:96::7",
        "fd00:97::1",
        "nonsense",
        "192.168.1.9",
        "10.96.0.6",
    ]
)
ranges = st.sampled_from(
    [
        "203.0.113.0/24",
        "203.0.113.1/24",
        "0.0.0.0/0",
        "2001:db8::/64",
        "10.0.0.0/33",
        "x",
        "1.2.3.4",
    ]
)
ports = st.fixed_dictionaries(
    {},
    optional={
        "name": names,
        "protocol": st.sampled_from(["TCP", "UDP", "SCTP", "ICMP", "tcp"]),
        "port": numbers,
        "targetPort": st.one_of(numbers, names),
        "nodePort": numbers,
        "bogus": wild,
    },
)
rough = st.fixed_dictionaries(
    {
        "namespace": st.sampled_from(["default", "kube-system", "Bad"]),
        "name": st.sampled_from(["web", "db", "-x"]),
    },
    optional={
        "type": st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]),
        "ports": st.one_of(st.lists(ports, max_size=3), wild),
        "clusterIPs": st.one_of(st.lists(ips, max_size=2), wild),
        "externalIPs": st.one_of(st.lists(ips, max_size=2), wild),
        "selector": st.one_of(
            st.dictionaries(
                st.sampled_from(["app", "tier", "bad key"]),
                st.sampled_from(["web", "", "-bad"]),
                max_size=2,
            ),
            wild,
        ),
        "sessionAffinity": st.sampled_from(["None", "ClientIP", "Sticky"]),
        "timeoutSeconds": numbers,
        "externalTrafficPolicy": st.sampled_from(["Cluster", "Local", "local"]),
        "internalTrafficPolicy": st.sampled_from(["Cluster", "Local", "x"]),
        "loadBalancerIPs": st.one_of(st.lists(ips, max_size=2), wild),
        "loadBalancerSourceRanges": st.one_of(st.lists(ranges, max_size=2), wild),
        "extra": wild,
    },
)
good_ports = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["http", "dns", "metrics"]), "port": st.integers(1, 65535)},
        optional={
            "protocol": st.sampled_from(["TCP", "UDP", "SCTP"]),
            "targetPort": st.one_of(st.integers(1, 65535), st.just("web")),
            "nodePort": st.integers(30000, 30100),
        },
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda p: p["name"],
)
good = st.fixed_dictionaries(
    {
        "namespace": st.just("default"),
        "name": st.just("web"),
        "type": st.just("NodePort"),
        "ports": good_ports,
    },
    optional={
        "clusterIPs": st.sampled_from([["10.96.0.5"], ["fd00:96::7", "10.96.0.6"]]),
        "externalIPs": st.sampled_from([["192.168.1.9"]]),
        "selector": st.just({"app": "web"}),
        "internalTrafficPolicy": st.just("Local"),
        "externalTrafficPolicy": st.just("Local"),
    },
)
good_lb = st.fixed_dictionaries(
    {
        "namespace": st.just("default"),
        "name": st.just("web"),
        "type": st.just("LoadBalancer"),
        "ports": good_ports,
    },
    optional={
        "loadBalancerIPs": st.sampled_from([["192.168.1.9"], ["198.51.100.1", "2001:db8::1"]]),
        "loadBalancerSourceRanges": st.sampled_from([["203.0.113.0/24"], ["0.0.0.0/0", "::/0"]]),
        "externalTrafficPolicy": st.just("Local"),
    },
)
nudged = st.tuples(
    st.one_of(good, good_lb),
    st.dictionaries(
        st.sampled_from([*SPEC_FIELDS, "extra"]), st.one_of(wild, ips, numbers), max_size=2
    ),
).map(lambda pair: {**pair[0], **pair[1]})
specs = st.one_of(good, good_lb, nudged, rough)


@SETTINGS
@given(specs)
def test_any_spec_is_a_record_or_code_7_naming_a_field(spec):
    try:
        record = validate_service(spec, CONFIG)
    except InvalidConfig as exc:
        assert exc.code == 7
        named = FIELD.match(exc.msg)
        assert named and named.group(1) in (*SPEC_FIELDS, "extra"), exc.msg
        return
    assert record.key == service_key(spec["namespace"], spec["name"])
    assert len({ipaddress.ip_address(ip).version for ip in record.cluster_ips}) == len(
        record.cluster_ips
    )
    assert all(30000 <= p.node_port <= 30100 for p in record.ports if p.node_port)
    assert record.type in ("NodePort", "LoadBalancer") or not any(
        p.node_port for p in record.ports
    )
    lb = record.load_balancer_ips or record.load_balancer_source_ranges
    assert record.type == "LoadBalancer" or not lb
    assert validate_service(record.spec(), CONFIG) == record


extras = st.dictionaries(st.sampled_from(["future", "zz"]), st.integers(), max_size=2)
records = st.builds(
    ServiceRecord,
    st.just("default"),
    st.sampled_from(["web", "db"]),
    st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]),
    st.lists(
        st.builds(
            ServicePort,
            st.sampled_from(["", "http"]),
            st.sampled_from(["TCP", "UDP"]),
            st.integers(1, 65535),
            st.one_of(st.integers(1, 65535), st.just("http")),
            st.integers(0, 32767),
            extras,
        ),
        max_size=3,
    ).map(tuple),
    st.lists(ips, max_size=2).map(tuple),
    st.lists(ips, max_size=2).map(tuple),
    st.dictionaries(st.sampled_from(["app", "tier"]), st.text("abc", max_size=3)),
    st.sampled_from(["None", "ClientIP"]),
    st.integers(1, 86400),
    st.sampled_from(["Cluster", "Local"]),
    st.sampled_from(["Cluster", "Local"]),
    extras,
    health_check_node_port=st.one_of(st.just(0), st.integers(30000, 32767)),
    load_balancer_ips=st.lists(ips, max_size=2).map(tuple),
    load_balancer_source_ranges=st.lists(ranges, max_size=2).map(tuple),
)


@SETTINGS
@given(records)
def test_service_codec_round_trips_keeping_unknown_fields(record):
    back = ServiceRecord.from_bytes(record.key, record.to_bytes())
    assert back == record and back.extra == record.extra
    assert [p.extra for p in back.ports] == [p.extra for p in record.ports]


endpoints = st.builds(
    EndpointRecord,
    st.sampled_from(["default", "other"]),
    st.sampled_from(["p1", "p2", "p3"]),
    st.sampled_from(["eth0", "net1"]),
    st.lists(ips, max_size=2).map(tuple),
    st.dictionaries(st.sampled_from(["app", "tier"]), st.sampled_from(["a", "b"])),
    st.sampled_from(["", "node1"]),
    st.dictionaries(st.sampled_from(["http", "dns"]), st.integers(1, 65535)),
    st.text("0123abcdef", max_size=8),
    st.sampled_from(["", "net"]),
    extras,
)


@SETTINGS
@given(
    endpoints,
    st.lists(
        st.sampled_from(["10.96.0.0/16", "fd00::/112", "10.96.0.1/16", "x", ""])
        | st.text(max_size=4),
        max_size=2,
    ),
)
def test_endpoint_and_settings_codecs_round_trip(endpoint, cidrs):
    back = EndpointRecord.from_bytes(endpoint.key, endpoint.to_bytes())
    assert back == endpoint and back.extra == endpoint.extra
    settings_ = ServiceSettings(tuple(cidrs), (1, 2), {"future": 1})
    try:
        valid = all(ipaddress.ip_network(c) for c in cidrs)
    except ValueError:
        valid = False
    if not valid:  # a host-bit or unparsable CIDR: the record is unreadable, never half-read
        with pytest.raises(CorruptRecord):
            ServiceSettings.from_bytes("k", settings_.to_bytes())
        return
    again = ServiceSettings.from_bytes("k", settings_.to_bytes())
    assert again == settings_ and again.extra == {"future": 1}


@SETTINGS
@given(
    st.lists(
        st.sampled_from(
            ["10.96.0.0/16", "10.0.0.0/30", "fd00::/64", "10.1.0.1/24", "x", "10.0.0.0/31"]
        ),
        max_size=3,
    ),
    st.sampled_from(["30000-32767", "1-65535", "5-4", "0-9", "a-b", "30000", "1-70000"]),
)
def test_settings_are_valid_or_refused_naming_the_field(cidrs, span):
    try:
        found = validate_settings(cidrs, span)
    except InvalidConfig as exc:
        assert exc.msg.startswith(
            ("invalid Service field cidrs[", "invalid Service field nodePortRange")
        )
        return
    assert len({ipaddress.ip_network(c).version for c in found.cidrs}) == len(found.cidrs)
    assert found.range_text == span


@SETTINGS
@given(st.text(alphabet="abc0123456789:/TCPUDP-", max_size=20))
def test_port_text_is_a_spec_port_or_refused_naming_the_flag(text):
    try:
        port = parse_port(text)
    except Failed as exc:
        assert exc.msg.startswith("--port ")
        return
    assert isinstance(port["port"], int) and set(port) <= {
        "name",
        "port",
        "protocol",
        "targetPort",
        "nodePort",
    }


@SETTINGS
@given(
    st.sampled_from(["", "http"]),
    st.integers(1, 65535),
    st.sampled_from(["", "/UDP"]),
    st.one_of(st.just(""), st.integers(1, 65535).map(str), st.just("web")),
    st.one_of(st.just(""), st.integers(30000, 32767).map(str)),
)
def test_port_text_says_what_it_parses_to(name, number, proto, target, node_port):
    text = (
        (f"{name}:" if name else "")
        + f"{number}{proto}"
        + (f":{target}" if target or node_port else "")
        + (f":{node_port}" if node_port else "")
    )
    port = parse_port(text)
    assert port.get("name", "") == name and port["port"] == number
    assert port.get("protocol", "") == proto[1:]
    assert str(port.get("targetPort", "")) == target
    assert str(port.get("nodePort", "")) == node_port


@SETTINGS
@given(
    st.dictionaries(st.sampled_from(["app", "tier"]), st.sampled_from(["a", "b"])),
    st.lists(endpoints, max_size=6),
)
def test_a_selector_picks_the_endpoints_holding_all_its_labels(selector, found):
    service = ServiceRecord(
        "default",
        "web",
        ports=(ServicePort("http", "TCP", 80, "http"), ServicePort("raw", "TCP", 81, 9000)),
        selector=selector,
    )
    picked = calc_endpoints(service, found)
    expected = [
        e
        for e in found
        if e.namespace == "default"
        and selector
        and all(e.labels.get(k) == v for k, v in selector.items())
    ]
    assert [e for e, _ in picked] == expected
    for endpoint, served in picked:
        assert matches(selector, endpoint.labels)
        assert served.get("raw") == 9000 and served.get("http") == endpoint.ports.get("http")
        assert ("http" in served) == ("http" in endpoint.ports)


def test_a_corrupt_service_is_an_internal_error_naming_its_key():
    try:
        ServiceRecord.from_bytes("/k", b'{"namespace": "a"}')
    except CNIError as exc:
        assert exc.code == 999 and "/k" in exc.msg


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"type": "ExternalName"}, "type"),
        ({"clusterIPs": ["None"]}, "clusterIPs[0]"),  # headless
        ({"clusterIP": "None"}, "clusterIP"),
    ],
)
def test_what_the_proxy_has_nothing_to_program_for_is_refused_naming_the_field(spec, field):
    """ExternalName and headless Services are DNS-only in Kubernetes (README: Against
    Kubernetes' Service documentation)."""
    with pytest.raises(InvalidConfig) as caught:
        validate_service({"namespace": "ns", "name": "x", "ports": [{"port": 80}], **spec}, CONFIG)
    assert caught.value.code == 7 and f"field {field}:" in str(caught.value)

"""type LoadBalancer: the record, its edits and the proxy's elements and tracer (no kernel).

Load balancer ingress IPs are external entries like externalIPs (DNATed, externalTrafficPolicy
applied to outside clients, Pods and the node short-circuited to every endpoint); a
LoadBalancer Service has nodePorts, as in Kubernetes. loadBalancerSourceRanges fence its load
balancer IPs before DNAT (golden file; generated ranges, node addresses and clients: the
tracer drops exactly the clients the firewall elements do not hold).

Regenerate the golden file after an intended change with PYCNI_UPDATE_GOLDEN=1."""

from __future__ import annotations

import ipaddress
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.svc import render_service
from cni.spec.errors import InvalidConfig
from services.ops.edit import change, create, set_settings, show
from services.proxy.elements import calc_elements
from services.proxy.model import NodeView, ProxyModel, ProxyPort, ProxyService
from services.proxy.table import render_transaction
from services.proxy.trace import explain
from services.proxy.view import calc_service
from services.record import ServicePort, ServiceRecord
from store.sqlite import SqliteStore
from tests.fixtures.golden import GOLDEN, golden  # noqa: F401
from tests.fixtures.svc_model import BALANCED_MODEL, NODE, be, view

A = ipaddress.ip_address
LB_IP = "198.51.100.10"


@pytest.fixture()
def store(tmp_path):
    store = SqliteStore(str(tmp_path / "store.db"))
    set_settings(store, ["10.96.0.0/24", "fd00:96::/120"], "30000-30100")
    yield store
    store.close()


def lb_spec(**more) -> dict:
    return {
        "namespace": "ns",
        "name": "lb",
        "type": "LoadBalancer",
        "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
        "loadBalancerIPs": [LB_IP, "2001:db8::10"],
        **more,
    }


def test_a_load_balancer_gets_node_ports_and_keeps_its_ips(store):
    record = create(store, lb_spec())["service"]
    assert record["ports"][0]["nodePort"] == 30000
    assert record["loadBalancerIPs"] == [LB_IP, "2001:db8::10"]
    doc = show(store, "ns", "lb")
    text = render_service(doc)
    assert "(LoadBalancer)" in text and f"loadBalancerIPs: {LB_IP},2001:db8::10" in text
    changed = change(store, "ns", "lb", {"loadBalancerIPs": ["198.51.100.11"]})["service"]
    assert changed["loadBalancerIPs"] == ["198.51.100.11"]
    assert changed["ports"][0]["nodePort"] == 30000  # the allocation stays


def test_leaving_load_balancer_drops_its_ips_and_ranges(store):
    create(store, lb_spec(loadBalancerSourceRanges=["203.0.113.0/24"]))
    back = change(store, "ns", "lb", {"type": "ClusterIP"})["service"]
    assert "loadBalancerIPs" not in back and "loadBalancerSourceRanges" not in back
    assert "nodePort" not in back["ports"][0]
    assert "loadBalancerIPs" not in render_service(show(store, "ns", "lb"))


@pytest.mark.parametrize(
    "more,field",
    [
        ({"loadBalancerIPs": ["10.96.0.9"]}, "loadBalancerIPs[0]"),  # a service CIDR's
        ({"loadBalancerIPs": ["127.0.0.1"]}, "loadBalancerIPs[0]"),
        ({"loadBalancerIPs": [LB_IP, LB_IP]}, "loadBalancerIPs[1]"),
        ({"loadBalancerIPs": "x"}, "loadBalancerIPs"),
        ({"type": "NodePort"}, "loadBalancerIPs"),
        ({"loadBalancerSourceRanges": ["203.0.113.1/24"]}, "loadBalancerSourceRanges[0]"),
        ({"loadBalancerSourceRanges": ["nope"]}, "loadBalancerSourceRanges[0]"),
    ],
)
def test_a_bad_load_balancer_field_is_refused_naming_it(store, more, field):
    with pytest.raises(InvalidConfig) as bad:
        create(store, lb_spec(**more))
    assert bad.value.code == 7 and f"field {field}:" in bad.value.msg


def test_only_a_load_balancer_record_gives_the_proxy_load_balancer_ips():
    port = ServicePort("http", "TCP", 80, 8080, 30000)
    record = ServiceRecord(
        "ns",
        "lb",
        "LoadBalancer",
        (port,),
        ("10.96.0.1",),
        load_balancer_ips=(LB_IP, "2001:db8::10"),
        load_balancer_source_ranges=("203.0.113.0/24", "2001:db8:1::/48"),
    )
    four = calc_service(record, 4)
    assert four.load_balancer_ips == (A(LB_IP),)
    assert four.source_ranges == (ipaddress.ip_network("203.0.113.0/24"),)
    assert four.ports[0].node_port == 30000
    gone = calc_service(replace(record, type="NodePort"), 4)
    assert gone.load_balancer_ips == () and gone.source_ranges == ()


LB = ProxyService(
    "ns",
    "lb",
    (A("10.96.0.30"),),
    ports=(ProxyPort("http", "tcp", 80, 30080),),
    external_local=True,
    load_balancer_ips=(A(LB_IP),),
)
LB_VIEW = view(LB, LB.ports[0], be("10.0.0.2"), be("10.0.1.2", local=False))
LB_MODEL = ProxyModel(4, NODE, (LB_VIEW,))


def test_a_load_balancer_ip_is_dispatched_like_an_external_ip():
    elements = {(e.name, e.key, e.value) for e in calc_elements(LB_MODEL)}
    key = f"{LB_IP} . tcp . 80"
    assert ("service-ips", key, "goto lb-1") in elements  # Local: this node's endpoint
    assert ("backends-tcp", f"{key} . 0", "10.0.0.2 . 8080") in elements
    assert ("sc-service-ips", key, "goto sc-lb-2") in elements  # Pods, the node: every one
    assert ("external-masq", key, None) not in elements


@pytest.mark.parametrize(
    "src,backends,masquerade",
    [
        ("203.0.113.5", {"10.0.0.2"}, False),  # outside: the Local policy, its IP kept
        ("10.0.3.4", {"10.0.0.2", "10.0.1.2"}, False),  # a Pod: short-circuited
        ("192.168.0.2", {"10.0.0.2", "10.0.1.2"}, True),  # the node: masqueraded
    ],
)
def test_the_tracer_names_the_load_balancer_ip_and_applies_the_policy_by_source(
    src, backends, masquerade
):
    a = explain(LB_MODEL, NODE, A(src), 5555, A(LB_IP), 80, "tcp")
    assert (a.entry, a.verdict) == ("LoadBalancerIP", "dnat")
    assert {c.ip for c in a.choices} == backends
    assert {c.masquerade for c in a.choices} == {masquerade}


def test_a_fenced_load_balancer_renders_as_the_golden_file():
    text = render_transaction(None, BALANCED_MODEL)
    assert text == golden("svc_lb4.nft", text)


def allowed_by_elements(elements, key: str, src: ipaddress.IPv4Address) -> bool:
    """What ``firewall-check`` does: a key in firewall-ips passes only a source one of its
    firewall-allow intervals holds."""
    if ("firewall-ips", key, None) not in elements:
        return True
    return any(
        src in ipaddress.ip_network(k.rsplit(" . ", 1)[1])
        for name, k, _ in elements
        if name == "firewall-allow" and k.rsplit(" . ", 1)[0] == key
    )


nets = st.builds(
    lambda a, b, p: ipaddress.ip_network(f"{a}.{b}.0.0/{p}", strict=False),
    st.sampled_from([10, 192, 198, 203]),
    st.integers(0, 3),
    st.integers(8, 24),
)
hosts = st.builds(
    lambda a, b, c: ipaddress.ip_address(f"{a}.{b}.{c}.7"),
    st.sampled_from([10, 192, 198, 203]),
    st.integers(0, 3),
    st.integers(0, 2),
)


@settings(max_examples=200, deadline=None, database=None)
@given(
    st.lists(nets, max_size=4),
    st.lists(hosts, min_size=1, max_size=2, unique=True),
    st.lists(hosts, max_size=2, unique=True),
    hosts,
    st.booleans(),
)
def test_the_tracer_fences_exactly_the_clients_the_firewall_elements_do(
    ranges, lb_ips, node_ips, src, local
):
    """Generated ranges (overlapping, nested), load balancer IPs, node addresses and clients:
    the firewall-allow intervals never overlap per key (an interval set refuses that), hold
    the ranges, the load balancer IPs too when a range holds a node address, and the tracer
    drops a client exactly when they do not hold it."""
    node = NodeView("n1", tuple(node_ips), NODE.cluster_cidrs, NODE.service_cidrs)
    svc = ProxyService(
        "ns",
        "lb",
        (A("10.96.0.30"),),
        ports=(ProxyPort("http", "tcp", 80, 30080),),
        external_local=local,
        load_balancer_ips=tuple(lb_ips),
        source_ranges=tuple(ranges),
    )
    model = ProxyModel(4, node, (view(svc, svc.ports[0], be("10.0.0.2")),))
    elements = {(e.name, e.key, e.value) for e in calc_elements(model)}
    in_node = any(ip in n for n in ranges for ip in node_ips)
    for lb in lb_ips:
        key = f"{lb} . tcp . 80"
        allow = [
            ipaddress.ip_network(k.rsplit(" . ", 1)[1])
            for n, k, _ in elements
            if n == "firewall-allow" and k.rsplit(" . ", 1)[0] == key
        ]
        assert not any(a.overlaps(b) for i, a in enumerate(allow) for b in allow[i + 1 :])
        for probe in (src, *lb_ips, *node_ips):
            want = not ranges or any(probe in n for n in ranges) or (in_node and probe in lb_ips)
            assert allowed_by_elements(elements, key, probe) == want
        answer = explain(model, node, src, 999, lb, 80, "tcp")
        fenced = not allowed_by_elements(elements, key, src)
        assert (answer.verdict == "drop") == fenced, answer
        if fenced:
            assert answer.entry == "LoadBalancerIP" and "loadBalancerSourceRanges" in answer.reason

"""An outside review of the Service proxy (issue 9): each test states a behaviour the feature
list, kube-proxy's semantics or an operator needs, and is marked ``xfail(strict=True)`` with the
diagnosis while the code does otherwise, so the suite stays green and a fix turns it into a
failure to un-mark. Pure: records, models and the store in a temp dir; no kernel.
"""
from __future__ import annotations

import ipaddress

import pytest
from hypothesis import example, given, settings, strategies as st

from cni.proxy import conntrack
from cni.proxy.elements import calc_port_parts
from cni.proxy.model import Backend, NodeView, ProxyModel, ProxyPort, ProxyService, \
    ServicePortView
from cni.proxy.sync import calc_plan
from cni.spec.errors import CNIError, InvalidConfig
from ipam.ops.services import create, list_services, remove, set_settings
from ipam.records import SERVICES, SERVICES_META, encode
from ipam.services.record import ServicePort, ServiceRecord, ServiceSettings
from ipam.services.validate import validate_service
from ipam.store.base import Put
from ipam.store.sqlite import SqliteStore
from tests.unit.test_proxy_table import base_records
from tests.unit.test_proxy_view import kv

SETTINGS = ServiceSettings(("10.96.0.0/16",))
NODE = NodeView("n1", (ipaddress.ip_address("192.168.0.2"),),
                (ipaddress.ip_network("10.0.0.0/16"),), (ipaddress.ip_network("10.96.0.0/16"),))


@pytest.mark.parametrize("cidr", ["10.96.0.1/16", "garbage"])
def test_an_unreadable_settings_cidr_does_not_stop_every_service(cidr):
    records = base_records()
    svc = ServiceRecord("ns", "a", "ClusterIP", (ServicePort("http", "TCP", 80, 8080),),
                        ("10.96.0.5",), (), {"app": "a"})
    records.apply(kv(svc.key, svc.to_bytes()))
    records.apply(kv(SERVICES_META, encode({"cidrs": [cidr], "nodePortRange": "30000-32767"})))
    plan = calc_plan(records, "n1", 4, ["192.168.0.2"], None, records.take_dirty())
    assert plan is not None and "10.96.0.5 . tcp . 80" in plan.script


def test_a_removed_udp_entry_point_is_cleaned():
    before = {("10.96.0.5", 53): frozenset({"10.0.0.7"})}
    assert conntrack.calc_checks(before, {}, False) == {("10.96.0.5", 53): frozenset()}


def udp_model(n: int) -> ProxyModel:
    ports = tuple(ServicePortView(ProxyService("ns", f"s{i}", (ipaddress.ip_address(
        f"10.96.{i // 250}.{i % 250 + 1}"),), ports=(ProxyPort("dns", "udp", 53),)),
        ProxyPort("dns", "udp", 53), (Backend(ipaddress.ip_address("10.0.0.7"), 53, "n1",
                                              True),)) for i in range(n))
    return ProxyModel(4, NODE, ports)


def test_a_full_render_lists_conntrack_once_not_once_per_udp_entry_point(monkeypatch):
    calls = []
    monkeypatch.setattr(conntrack, "_conntrack", lambda args: calls.append(args) or "")
    serving = conntrack.calc_udp_serving(udp_model(200))
    conntrack.clean_stale(conntrack.calc_checks(serving, serving, True), 4)
    assert len(calls) <= 2


def affinity_view(ips: list[str]) -> ServicePortView:
    service = ProxyService("ns", "a", (ipaddress.ip_address("10.96.0.5"),),
                           ports=(ProxyPort("http", "tcp", 80),), affinity_timeout=60)
    return ServicePortView(service, service.ports[0], tuple(
        Backend(ipaddress.ip_address(ip), 8080, "n1", True) for ip in ips))


def slot_of(view: ServicePortView, ip: str) -> str:
    elements, _ = calc_port_parts(view, ProxyModel(4, NODE, (view,)))
    return next(e.name for e in elements if e.name.startswith("slot-")
                and e.value == f"{ip} . 8080")


@pytest.mark.xfail(strict=True, reason="cni/proxy/elements.py _dispatch_elements: ClientIP "
                   "affinity sticks a client to a backend *index* (sticky-i -> slot-i), and the "
                   "index is the backend's place in IP order; an endpoint joining with a lower "
                   "IP shifts every slot, so sticky clients move to another Pod before their "
                   "timeout (kube-proxy's affinity is per endpoint)")
@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(2, 200), min_size=1, max_size=4, unique=True), st.integers(2, 200))
@example([5], 3)
def test_a_sticky_backend_keeps_its_slot_when_another_endpoint_joins(hosts, joining):
    ips = [f"10.0.0.{h}" for h in hosts]
    newcomer = f"10.0.0.{joining}"
    if newcomer in ips:
        return
    before, after = affinity_view(ips), affinity_view([*ips, newcomer])
    assert all(slot_of(before, ip) == slot_of(after, ip) for ip in ips)


@pytest.mark.parametrize("ip", ["127.0.0.1", "::1", "169.254.169.254", "fe80::1", "224.0.0.1"])
def test_a_special_external_ip_is_refused(ip):
    spec = {"namespace": "ns", "name": "a", "ports": [{"port": 80}], "externalIPs": [ip]}
    with pytest.raises(InvalidConfig, match="externalIPs"):
        validate_service(spec, SETTINGS)


@pytest.fixture()
def store(tmp_path):
    store = SqliteStore(str(tmp_path / "store.db"))
    set_settings(store, ["10.96.0.0/24"], "30000-32767")
    yield store
    store.close()


def put_corrupt_service(store) -> None:
    store.txn([], [Put(f"{SERVICES}ns/bad", b'{"namespace": "ns", "name": "bad", '
                                            b'"ports": [{"port": "x"}]}')])


def test_an_unreadable_service_can_be_removed(store):
    put_corrupt_service(store)
    assert remove(store, "ns", "bad")["removed"] == "ns/bad"
    assert store.get(f"{SERVICES}ns/bad") is None


def test_one_unreadable_service_does_not_hide_the_others_from_ls(store):
    create(store, {"namespace": "ns", "name": "good", "ports": [{"port": 80}]})
    put_corrupt_service(store)
    try:
        names = [s["name"] for s in list_services(store)["services"]]
    except CNIError:
        names = []
    assert "good" in names

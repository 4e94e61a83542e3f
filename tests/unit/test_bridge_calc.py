"""pycni-bridge's pure rules: gateways, routes, bridge addresses and conflicts, derived names."""

from __future__ import annotations

import ipaddress

from common.attachment import Attachment, network_hash, tag_in_network, tag_of_alias
from plugins.bridge.calc import (
    bridge_addresses,
    calc_bridge_conflicts,
    calc_ips,
    calc_routes,
    family_gateways,
    masq_pairs,
    route_specs,
)

V4 = {"address": "10.22.0.5/24"}
V6 = {"address": "fd00::5/64", "gateway": "fd00::1"}
iface = ipaddress.ip_interface


def test_ips_go_on_the_container_and_get_a_gateway_with_is_gateway():
    assert calc_ips([V4, V6], is_gateway=True) == [
        {"address": "10.22.0.5/24", "gateway": "10.22.0.1", "interface": 2},
        {"address": "fd00::5/64", "gateway": "fd00::1", "interface": 2},
    ]
    assert calc_ips([V4], is_gateway=False) == [{"address": "10.22.0.5/24", "interface": 2}]


def test_family_gateways_take_the_first_of_each_family():
    ips = calc_ips([V4, {"address": "10.23.0.5/24", "gateway": "10.23.0.1"}, V6], True)
    assert family_gateways(ips) == {
        4: ipaddress.ip_address("10.22.0.1"),
        6: ipaddress.ip_address("fd00::1"),
    }


def test_default_route_added_once_per_family_with_is_default_gateway():
    ips = calc_ips([V4, V6], True)
    assert calc_routes([], ips, is_default_gateway=True) == [
        {"dst": "0.0.0.0/0", "gw": "10.22.0.1"},
        {"dst": "::/0", "gw": "fd00::1"},
    ]
    ipam = [{"dst": "0.0.0.0/0", "gw": "10.22.0.254"}]
    assert calc_routes(ipam, ips, True) == ipam + [{"dst": "::/0", "gw": "fd00::1"}]
    assert calc_routes(ipam, ips, False) == ipam


def test_installed_routes_default_their_gateway_to_the_family_gateway():
    ips = calc_ips([V4, V6], True)
    routes = [
        {"dst": "0.0.0.0/0"},
        {"dst": "192.168.0.0/16", "gw": "10.22.0.9", "priority": 7},
        {"dst": "fd10::/64"},
    ]
    specs = route_specs(routes, ips, oif=2)
    assert [(str(s.dst), str(s.gw), s.oif, s.priority) for s in specs] == [
        ("0.0.0.0/0", "10.22.0.1", 2, None),
        ("192.168.0.0/16", "10.22.0.9", 2, 7),
        ("fd10::/64", "fd00::1", 2, None),
    ]
    no_gateway = route_specs([{"dst": "10.30.0.0/16"}], calc_ips([V4], False), oif=2)
    assert no_gateway[0].gw is None


def test_bridge_addresses_are_distinct_gateways_with_the_subnet_prefix():
    ips = calc_ips([V4, {"address": "10.22.0.6/24"}, V6], True)
    assert bridge_addresses(ips) == [iface("10.22.0.1/24"), iface("fd00::1/64")]


def test_conflicts_follow_the_reference_rules():
    wanted = [iface("10.22.0.1/24"), iface("fd00::1/64")]
    assert calc_bridge_conflicts([iface("10.22.0.1/24"), iface("fe80::1/64")], wanted) == []
    assert calc_bridge_conflicts([iface("10.99.0.1/16")], wanted) == [iface("10.99.0.1/16")]
    assert calc_bridge_conflicts([iface("10.22.0.1/16")], wanted) == [iface("10.22.0.1/16")]
    assert calc_bridge_conflicts([iface("fd00::9/64")], wanted) == [iface("fd00::9/64")]
    assert calc_bridge_conflicts([iface("fd99::9/64")], wanted) == []  # other v6 subnets coexist
    assert calc_bridge_conflicts([iface("10.99.0.1/16")], [iface("fd00::1/64")]) == []


def test_masq_pairs_are_address_and_own_subnet():
    assert masq_pairs([V4, V6]) == [
        (ipaddress.ip_address("10.22.0.5"), ipaddress.ip_network("10.22.0.0/24")),
        (ipaddress.ip_address("fd00::5"), ipaddress.ip_network("fd00::/64")),
    ]


def test_host_veth_name_is_derived_short_and_distinct():
    a = Attachment("podnet", "c1", "eth0")
    assert a.host_veth == Attachment("podnet", "c1", "eth0").host_veth
    assert len(a.host_veth) == 15 and a.host_veth.startswith("veth")
    others = {
        Attachment("podnet", "c2", "eth0").host_veth,
        Attachment("podnet", "c1", "eth1").host_veth,
        Attachment("other", "c1", "eth0").host_veth,
    }
    assert a.host_veth not in others and len(others) == 3


def test_tags_plain_or_hashed_and_their_network():
    plain = Attachment("podnet", "c1", "eth0")
    assert plain.tag == "podnet/c1/eth0" and plain.alias == "pycni:podnet/c1/eth0"
    long = Attachment("podnet", "c" * 120, "eth0")
    odd = Attachment("podnet", "c1", 'e"th0')
    for att in (long, odd):
        assert att.tag.startswith(network_hash("podnet") + "/") and '"' not in att.tag
        assert len(att.tag) < 64 and tag_in_network(att.tag, "podnet")
    assert tag_in_network(plain.tag, "podnet") and not tag_in_network(plain.tag, "podne")
    assert not tag_in_network(long.tag, "other")
    assert tag_of_alias(plain.alias) == plain.tag and tag_of_alias("uplink") is None

"""The underlay helpers against a real kernel: a node namespace joined to a "router" namespace
by a veth pair (and a second one to a "side" namespace), with and without a default route."""

from __future__ import annotations

import pytest
from pyroute2 import IPRoute

from cni.spec.errors import InvalidConfig
from overlay.underlay import (
    Underlay,
    calc_overlay_mtu,
    check_direct,
    default_underlay,
    device_mtu,
    device_of,
    resolve_underlay,
)


@pytest.fixture
def topo(netns_factory):
    """node:u0 192.168.91.1/24 (+ secondary .5) <-> router:r0 .254; node:s0 172.30.5.1/24
    <-> side; fd91::1/64 on u0. No default route yet."""
    node, router, side = netns_factory("node"), netns_factory("router"), netns_factory("side")
    node.run(f"ip link add u0 type veth peer name r0 netns {router.name}")
    node.run(f"ip link add s0 type veth peer name x0 netns {side.name}")
    node.run(
        "ip addr add 192.168.91.1/24 dev u0 && ip addr add 192.168.91.5/24 dev u0 && "
        "ip addr add fd91::1/64 dev u0 nodad && ip addr add 172.30.5.1/24 dev s0 && "
        "ip link set u0 up && ip link set s0 up"
    )
    router.run("ip addr add 192.168.91.254/24 dev r0 && ip link set r0 up")
    side.run("ip link set x0 up")
    ipr = IPRoute(netns=node.name, flags=0)  # flags=0: never create a missing netns
    yield node, ipr
    ipr.close()


def index(ipr: IPRoute, name: str) -> int:
    return ipr.link_lookup(ifname=name)[0]


def test_the_default_routes_device_gives_its_primary_address(topo):
    node, ipr = topo
    assert default_underlay(ipr) is None
    node.run("ip route add default via 192.168.91.254")
    assert default_underlay(ipr) == ("192.168.91.1", index(ipr, "u0"))
    assert resolve_underlay(ipr, None, "172.30.5.1") == Underlay(
        "192.168.91.1", index(ipr, "u0"), "u0", 1500, 4, "default route"
    )


def test_the_default_routes_source_address_wins_over_the_primary(topo):
    node, ipr = topo
    node.run("ip route add default via 192.168.91.254 src 192.168.91.5")
    assert default_underlay(ipr) == ("192.168.91.5", index(ipr, "u0"))


def test_the_lowest_metric_default_route_is_taken(topo):
    node, ipr = topo
    node.run(
        "ip route add default via 192.168.91.254 metric 200 && "
        "ip route add default dev s0 metric 100"
    )
    assert default_underlay(ipr) == ("172.30.5.1", index(ipr, "s0"))


def test_ipv6_default_route_when_there_is_no_ipv4_one(topo):
    node, ipr = topo
    node.run("ip -6 route add default via fd91::fe dev u0")
    assert default_underlay(ipr) == ("fd91::1", index(ipr, "u0"))
    underlay = resolve_underlay(ipr, None, None)
    assert (underlay.version, calc_overlay_mtu(underlay.mtu, underlay.version)) == (6, 1430)


def test_a_configured_address_wins_and_must_be_local(topo):
    node, ipr = topo
    node.run("ip route add default via 192.168.91.254 && ip link set s0 mtu 9000")
    assert device_of(ipr, "172.30.5.1") == index(ipr, "s0")
    assert device_mtu(ipr, index(ipr, "s0")) == 9000
    assert resolve_underlay(ipr, "172.30.5.1", None) == Underlay(
        "172.30.5.1", index(ipr, "s0"), "s0", 9000, 4, "configured"
    )
    assert resolve_underlay(ipr, "fd91:0::1", None).address == "fd91::1"
    for wrong in ("172.30.5.9", "not-an-ip"):
        with pytest.raises(InvalidConfig, match="overlay.underlayAddress") as info:
            resolve_underlay(ipr, wrong, "192.168.91.1")
        assert info.value.code == 7
    assert device_of(ipr, "172.30.5.9") is None


def test_without_a_default_route_the_node_address_then_an_error(topo):
    node, ipr = topo
    assert resolve_underlay(ipr, None, "172.30.5.1") == Underlay(
        "172.30.5.1", index(ipr, "s0"), "s0", 1500, 4, "node address"
    )
    for fallback in ("10.1.1.1", None):
        with pytest.raises(InvalidConfig, match="set overlay.underlayAddress"):
            resolve_underlay(ipr, None, fallback)


def test_check_direct_names_the_gateway_or_no_route(topo):
    node, ipr = topo
    assert check_direct(ipr, "192.168.91.254") is None
    assert check_direct(ipr, "172.30.5.77") is None
    assert check_direct(ipr, "10.50.0.1") == "no route"
    assert check_direct(ipr, "fd92::1") == "no route"
    node.run("ip route add default via 192.168.91.254 && ip route add blackhole 10.60.0.0/16")
    assert (
        check_direct(ipr, "10.50.0.1")
        == "not directly connected: routed via gateway 192.168.91.254"
    )
    assert check_direct(ipr, "10.60.0.1").startswith("no route")
    assert check_direct(ipr, "192.168.91.5") == "a local address of this node"

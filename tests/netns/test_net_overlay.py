"""The overlay's netlink mechanisms against a real kernel: the vxlan device, neighbours, FDB
entries, pycni-protocol routes and the netlink monitor, each in a fresh namespace with a veth
pair as its underlay. Entries someone else made (by hand with ``ip``) are never touched."""

from __future__ import annotations

import os
from functools import partial
from ipaddress import ip_address, ip_network

import pytest
from pyroute2 import IPRoute

from kernel.link import LinkError
from kernel.monitor import DELLINK, DELNEIGH, DELROUTE, NEWLINK, NetlinkMonitor
from kernel.neigh import (
    AF_BRIDGE,
    Fdb,
    Neigh,
    append_fdb,
    delete_fdb,
    delete_neigh,
    list_fdb,
    list_neighs,
    replace_neigh,
)
from kernel.ns import entered
from kernel.route import RTPROT_PYCNI, Route, delete_route, list_proto_routes, replace_route
from kernel.vxlan import VxlanSpec, ensure_vxlan, read_vxlan
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.netns
PEER_MAC = "66:00:00:00:00:01"


@pytest.fixture
def underlay(netns_factory):
    """A namespace whose veth ``u0`` has 192.168.77.1/24 and fd77::1/64."""
    ns = netns_factory("overlay")
    ns.run(
        "ip link add u0 type veth peer name u1 && ip link set u0 up && ip link set u1 up"
        " && ip addr add 192.168.77.1/24 dev u0 && ip addr add fd77::1/64 dev u0 nodad"
    )
    return ns


@pytest.fixture
def ipr(underlay):
    fd = os.open(underlay.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with entered(fd):
            session = IPRoute()
    finally:
        os.close(fd)
    yield session
    session.close()


def spec_for(ipr: IPRoute, **change) -> VxlanSpec:
    fields = dict(
        name="pycni.1",
        vni=1,
        port=4789,
        local="192.168.77.1",
        link_index=ipr.link_lookup(ifname="u0")[0],
        mac="66:11:22:33:44:55",
        mtu=1450,
    )
    return VxlanSpec(**{**fields, **change})


@pytest.fixture
def vx(ipr) -> int:
    return ensure_vxlan(ipr, spec_for(ipr))[0].index


def test_ensure_creates_once_with_learning_off(ipr, underlay):
    spec = spec_for(ipr)
    first, created = ensure_vxlan(ipr, spec)
    again, created_again = ensure_vxlan(ipr, spec)
    assert (created, created_again) == (True, False)
    assert again.index == first.index and again.up
    assert read_vxlan(ipr, "pycni.1") == spec
    details = underlay.run(["ip", "-d", "link", "show", "pycni.1"]).stdout
    assert "nolearning" in details and "dstport 4789" in details and "vxlan id 1 " in details


def test_a_changed_vni_recreates_the_device(ipr):
    first, _ = ensure_vxlan(ipr, spec_for(ipr))
    second, created = ensure_vxlan(ipr, spec_for(ipr, vni=7))
    assert created and second.index != first.index
    assert read_vxlan(ipr, "pycni.1").vni == 7


def test_learning_switched_on_by_hand_recreates_the_device(ipr, underlay):
    ensure_vxlan(ipr, spec_for(ipr))
    underlay.run(
        "ip link del pycni.1 && ip link add pycni.1 type vxlan id 1 dstport 4789"
        " local 192.168.77.1 dev u0"
    )  # the kernel's default: learning on
    assert read_vxlan(ipr, "pycni.1").learning
    _, created = ensure_vxlan(ipr, spec_for(ipr))
    assert created and not read_vxlan(ipr, "pycni.1").learning


def test_mac_and_mtu_are_fixed_in_place(ipr, underlay):
    first, _ = ensure_vxlan(ipr, spec_for(ipr))
    underlay.run(
        "ip link set pycni.1 down && ip link set pycni.1 address 66:aa:bb:cc:dd:ee mtu 1300"
    )
    fixed, created = ensure_vxlan(ipr, spec_for(ipr))
    assert not created and fixed.index == first.index
    assert (fixed.mac, fixed.mtu, fixed.up) == ("66:11:22:33:44:55", 1450, True)
    assert read_vxlan(ipr, "pycni.1") == spec_for(ipr)


def test_a_foreign_link_of_that_name_is_refused_and_kept(ipr, underlay):
    underlay.run("ip link add pycni.1 type veth peer name other")
    with pytest.raises(LinkError, match="veth"):
        ensure_vxlan(ipr, spec_for(ipr))
    assert read_vxlan(ipr, "pycni.1") is None
    assert "pycni.1" in underlay.links()


def ipv6_spec(ipr: IPRoute, **change) -> VxlanSpec:
    """An IPv6-underlay device: the kernel refuses an MTU above the underlay's - 70."""
    return spec_for(
        ipr, **{"name": "pycni.6", "vni": 6, "local": "fd77::1", "mtu": 1430, **change}
    )


def test_an_ipv6_underlay_device(ipr):
    spec = ipv6_spec(ipr, local="fd77:0::1")
    _, created = ensure_vxlan(ipr, spec)
    assert created and read_vxlan(ipr, "pycni.6").local == "fd77::1"
    assert not ensure_vxlan(ipr, spec)[1]


def test_neighbours_round_trip_and_leave_foreign_ones(ipr, underlay, vx):
    underlay.run("ip neigh add 10.22.0.99 lladdr 66:00:00:00:00:99 dev pycni.1 nud permanent")
    replace_neigh(ipr, vx, "10.22.0.70", PEER_MAC)
    replace_neigh(ipr, vx, ip_address("fd22::70"), PEER_MAC.upper())
    ours = {
        Neigh(vx, ip_address("10.22.0.70"), PEER_MAC, RTPROT_PYCNI),
        Neigh(vx, ip_address("fd22::70"), PEER_MAC, RTPROT_PYCNI),
    }
    assert set(list_neighs(ipr, vx, proto=RTPROT_PYCNI)) == ours
    assert Neigh(vx, ip_address("10.22.0.99"), "66:00:00:00:00:99", None) in list_neighs(ipr, vx)
    replace_neigh(ipr, vx, "10.22.0.70", "66:00:00:00:00:02")  # a peer's new VTEP MAC
    assert Neigh(vx, ip_address("10.22.0.70"), "66:00:00:00:00:02", RTPROT_PYCNI) in list_neighs(
        ipr, vx, proto=RTPROT_PYCNI
    )
    assert delete_neigh(ipr, vx, "10.22.0.70") and delete_neigh(ipr, vx, "fd22::70")
    assert not delete_neigh(ipr, vx, "10.22.0.70")
    assert list_neighs(ipr, vx, proto=RTPROT_PYCNI) == []
    assert "10.22.0.99" in underlay.run("ip neigh show dev pycni.1").stdout


def test_fdb_round_trip(ipr, underlay, vx):
    append_fdb(ipr, vx, PEER_MAC, "192.168.77.2")
    append_fdb(ipr, vx, PEER_MAC, ip_address("192.168.77.2"))  # the same entry: fine
    append_fdb(ipr, vx, "66:00:00:00:00:02", "192.168.77.3")
    assert set(list_fdb(ipr, vx)) == {
        Fdb(vx, PEER_MAC, ip_address("192.168.77.2")),
        Fdb(vx, "66:00:00:00:00:02", ip_address("192.168.77.3")),
    }
    assert delete_fdb(ipr, vx, PEER_MAC, "192.168.77.2")
    assert not delete_fdb(ipr, vx, PEER_MAC, "192.168.77.2")
    assert list_fdb(ipr, vx) == [Fdb(vx, "66:00:00:00:00:02", ip_address("192.168.77.3"))]


def test_an_ipv6_underlay_fdb_entry(ipr):
    vx6 = ensure_vxlan(ipr, ipv6_spec(ipr))[0].index
    append_fdb(ipr, vx6, PEER_MAC, "fd77::2")
    assert list_fdb(ipr, vx6) == [Fdb(vx6, PEER_MAC, ip_address("fd77::2"))]
    assert delete_fdb(ipr, vx6, PEER_MAC, "fd77::2") and list_fdb(ipr, vx6) == []


def overlay_route(dst: str, gw: str, oif: int) -> Route:
    return Route(dst=ip_network(dst), gw=ip_address(gw), oif=oif, proto=RTPROT_PYCNI, onlink=True)


def test_routes_by_protocol_round_trip_and_leave_foreign_ones(ipr, underlay, vx):
    underlay.run(
        "ip route add 10.30.0.0/24 dev u0 && ip route add 10.31.0.0/24 dev u0 proto 77"
        " table 100 && ip route add 10.32.0.0/24 via 10.22.0.70 dev pycni.1 onlink"
    )
    v4 = overlay_route("10.22.0.64/26", "10.22.0.70", vx)
    v6 = overlay_route("fd22:1::/64", "fd22::70", vx)
    replace_route(ipr, v4)
    replace_route(ipr, v4)  # replace: no EEXIST
    replace_route(ipr, v6)
    scoped = {r.dst: r for r in list_proto_routes(ipr, RTPROT_PYCNI)}
    assert set(scoped) == {v4.dst, v6.dst}
    assert scoped[v4.dst] == Route(dst=v4.dst, gw=v4.gw, oif=vx, scope=0, proto=77, onlink=True)
    assert [r.dst for r in list_proto_routes(ipr, RTPROT_PYCNI, version=6)] == [v6.dst]
    foreign = overlay_route("10.32.0.0/24", "10.22.0.70", vx)
    assert not delete_route(ipr, foreign)  # protocol boot: not pycni's, left alone
    assert delete_route(ipr, scoped[v4.dst])  # as listed: what a reconcile removes
    assert delete_route(ipr, v6) and not delete_route(ipr, v4)
    assert list_proto_routes(ipr, RTPROT_PYCNI) == []
    left = underlay.run("ip route show table all").stdout
    assert all(net in left for net in ("10.30.0.0/24", "10.31.0.0/24", "10.32.0.0/24"))


def test_the_monitor_sees_deletions_made_by_hand(ipr, underlay, vx):
    replace_route(ipr, overlay_route("10.22.0.64/26", "10.22.0.70", vx))
    replace_neigh(ipr, vx, "10.22.0.70", PEER_MAC)
    append_fdb(ipr, vx, PEER_MAC, "192.168.77.2")
    events: list[tuple[str, dict]] = []
    fd = os.open(underlay.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with entered(fd):
            monitor = NetlinkMonitor(lambda kind, summary: events.append((kind, summary)))
            monitor.start()
    finally:
        os.close(fd)
    try:
        assert monitor.subscribed.is_set()
        underlay.run(
            "ip route del 10.22.0.64/26 && ip neigh del 10.22.0.70 dev pycni.1"
            f" && bridge fdb del {PEER_MAC} dev pycni.1 dst 192.168.77.2 self"
            " && ip link add pycni.x type veth peer name pycni.y && ip link del pycni.1"
        )
        wanted = [
            (DELROUTE, {"dst": "10.22.0.64/26", "proto": 77}),
            (DELNEIGH, {"family": 2, "dst": "10.22.0.70", "ifindex": vx}),
            (DELNEIGH, {"family": AF_BRIDGE, "dst": "192.168.77.2", "mac": PEER_MAC}),
            (NEWLINK, {"ifname": "pycni.x", "kind": "veth"}),
            (DELLINK, {"ifname": "pycni.1", "index": vx, "kind": "vxlan"}),
        ]

        def seen(kind: str, fields: dict) -> bool:
            return any(k == kind and fields.items() <= s.items() for k, s in list(events))

        for kind, fields in wanted:
            wait_for(f"{kind} {fields}", partial(seen, kind, fields), timeout=5)
    finally:
        monitor.stop()
    assert not monitor.subscribed.is_set()


def test_the_monitor_outlives_a_failing_owner(underlay):
    def owner(kind: str, summary: dict) -> None:
        seen.append(kind)
        raise RuntimeError("the owner's bug")

    seen: list[str] = []
    fd = os.open(underlay.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with entered(fd):
            monitor = NetlinkMonitor(owner).start()
    finally:
        os.close(fd)
    try:
        underlay.run("ip link add pycni.a type veth peer name pycni.b")
        underlay.run("ip link del pycni.a")
        wait_for("both link events", lambda: DELLINK in seen and NEWLINK in seen, timeout=5)
    finally:
        monitor.stop()

"""Shaping the overlay's netlink requests and reading the kernel's answers back (pure).

Each request is turned into the message the kernel would dump for it (encoded and decoded by
pyroute2's own message classes, no socket), and the parser must give back what was asked for:
a request and its parser agree for any route, neighbour, FDB entry or vxlan device.
"""

from __future__ import annotations

import ipaddress
import socket

from hypothesis import given
from hypothesis import strategies as st
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.ndmsg import ndmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from kernel.monitor import DELLINK, DELNEIGH, DELROUTE, summary_of
from kernel.neigh import (
    AF_BRIDGE,
    NUD_PERMANENT,
    Fdb,
    Neigh,
    fdb_of,
    fdb_request,
    neigh_of,
    neigh_request,
)
from kernel.route import (
    MAIN_TABLE,
    RTNH_F_ONLINK,
    RTPROT_PYCNI,
    Route,
    proto_routes_of,
    route_request,
)
from kernel.vxlan import VxlanSpec, calc_vxlan_plan, vxlan_of, vxlan_request

MACS = st.binary(min_size=6, max_size=6).map(
    lambda raw: ":".join(f"{b:02x}" for b in bytes([raw[0] & 0xFE | 0x02]) + raw[1:])
)
MIXED_CASE_MACS = MACS.flatmap(lambda mac: st.sampled_from([mac, mac.upper()]))
INDEXES = st.integers(1, 2**31 - 1)
PROTOS = st.integers(1, 255)


def networks(version: int | None = None):
    addresses = st.ip_addresses(v=version) if version else st.ip_addresses()
    return addresses.flatmap(
        lambda a: st.integers(0, a.max_prefixlen).map(
            lambda n: ipaddress.ip_network(f"{a}/{n}", strict=False)
        )
    )


OVERLAY_ROUTES = networks().flatmap(
    lambda dst: st.builds(
        Route,
        dst=st.just(dst),
        gw=st.ip_addresses(v=dst.version),
        oif=INDEXES,
        scope=st.just(0),
        proto=PROTOS,
        onlink=st.booleans(),
    )
)


def decoded(msg):
    """``msg`` as it comes off a socket: encoded, then parsed again."""
    msg.encode()
    parsed = type(msg)(msg.data)
    parsed.decode()
    return parsed


def route_echo(args: dict, msg_type: int = 1):
    """The dump entry the kernel keeps for a route request in the main table."""
    dst, _, length = args["dst"].partition("/")
    msg = rtmsg()
    msg.update(
        family=args["family"],
        dst_len=int(length),
        proto=args.get("proto", 3),
        type=msg_type,
        table=MAIN_TABLE,
        flags=args.get("flags", 0),
        scope=args.get("scope", 0),
    )
    msg["attrs"] = [
        ("RTA_TABLE", MAIN_TABLE),
        ("RTA_DST", dst),
        ("RTA_OIF", args["oif"]),
        ("RTA_GATEWAY", args["gateway"]),
    ]
    return decoded(msg)


def neigh_echo(args: dict, family: int | None = None):
    msg = ndmsg()
    msg.update(
        family=family or args["family"],
        ifindex=args["ifindex"],
        state=args["state"],
        flags=args.get("flags", 0),
    )
    msg["attrs"] = [("NDA_DST", args["dst"]), ("NDA_LLADDR", args["lladdr"])] + (
        [("NDA_PROTOCOL", args["NDA_PROTOCOL"])] if "NDA_PROTOCOL" in args else []
    )
    return decoded(msg)


def link_echo(args: dict, index: int = 9):
    """The link message of a device created with ``args`` (mirrors what a get answers)."""
    local = (
        ("IFLA_VXLAN_LOCAL", args["vxlan_local"])
        if "vxlan_local" in args
        else ("IFLA_VXLAN_LOCAL6", args["vxlan_local6"])
    )
    data = [
        ("IFLA_VXLAN_ID", args["vxlan_id"]),
        ("IFLA_VXLAN_PORT", args["vxlan_port"]),
        local,
        ("IFLA_VXLAN_LINK", args.get("vxlan_link", 0)),
        ("IFLA_VXLAN_LEARNING", args["vxlan_learning"]),
    ]
    msg = ifinfmsg()
    msg.update(index=index, flags=1)
    msg["attrs"] = [
        ("IFLA_IFNAME", args["ifname"]),
        ("IFLA_ADDRESS", args["address"]),
        ("IFLA_MTU", args["mtu"]),
        (
            "IFLA_LINKINFO",
            {"attrs": [("IFLA_INFO_KIND", "vxlan"), ("IFLA_INFO_DATA", {"attrs": data})]},
        ),
    ]
    return decoded(msg)


def test_overlay_route_request():
    route = Route(
        dst=ipaddress.ip_network("10.22.0.64/26"),
        gw=ipaddress.ip_address("10.22.0.70"),
        oif=5,
        proto=RTPROT_PYCNI,
        onlink=True,
    )
    assert route_request(route) == {
        "dst": "10.22.0.64/26",
        "family": socket.AF_INET,
        "oif": 5,
        "gateway": "10.22.0.70",
        "proto": 77,
        "flags": RTNH_F_ONLINK,
    }


@given(OVERLAY_ROUTES)
def test_a_route_reads_back_as_requested(route):
    args = route_request(route)
    assert ("proto" in args, "flags" in args) == (True, route.onlink)
    assert ipaddress.ip_network(args["dst"]) == route.dst
    assert args["family"] == (socket.AF_INET if route.dst.version == 4 else socket.AF_INET6)
    assert proto_routes_of(route_echo(args)) == [route]


@given(networks(), st.one_of(st.none(), PROTOS), st.booleans())
def test_proto_and_onlink_only_when_asked(dst, proto, onlink):
    args = route_request(Route(dst=dst, oif=3, proto=proto, onlink=onlink))
    assert args.get("proto") == proto
    assert args.get("flags", 0) == (RTNH_F_ONLINK if onlink else 0)


@given(INDEXES, st.ip_addresses(), MIXED_CASE_MACS, PROTOS)
def test_a_neighbour_reads_back_as_requested(ifindex, ip, mac, proto):
    args = neigh_request(ifindex, str(ip), mac, proto)
    assert args["state"] == NUD_PERMANENT and args["NDA_PROTOCOL"] == proto
    assert neigh_of(neigh_echo(args)) == Neigh(ifindex, ip, mac.lower(), proto)


@given(INDEXES, st.ip_addresses())
def test_a_neighbour_delete_names_only_the_address(ifindex, ip):
    assert neigh_request(ifindex, ip) == {
        "ifindex": ifindex,
        "dst": str(ip),
        "family": socket.AF_INET if ip.version == 4 else socket.AF_INET6,
    }


@given(INDEXES, st.ip_addresses(), MACS, st.integers(0, 0xFF))
def test_only_permanent_ip_neighbours_are_listed(ifindex, ip, mac, state):
    args = dict(neigh_request(ifindex, ip, mac), state=state)
    assert (neigh_of(neigh_echo(args)) is not None) == bool(state & NUD_PERMANENT)
    assert neigh_of(neigh_echo(args, family=AF_BRIDGE)) is None  # an FDB entry


@given(INDEXES, MIXED_CASE_MACS, st.ip_addresses())
def test_an_fdb_entry_reads_back_as_requested(ifindex, mac, dst):
    args = fdb_request(ifindex, mac, dst)
    assert args["flags"] == 2 and args["state"] == NUD_PERMANENT
    assert fdb_of(neigh_echo(args, family=AF_BRIDGE)) == Fdb(ifindex, mac.lower(), dst)


def test_default_fdb_entries_are_not_peers():
    zero = fdb_request(4, "00:00:00:00:00:00", "192.168.77.2")
    assert fdb_of(neigh_echo(zero, family=AF_BRIDGE)) is None


def vxlan_specs():
    return st.builds(
        VxlanSpec,
        name=st.text("abcdefxyz.0123456789", min_size=1, max_size=15),
        vni=st.integers(0, 2**24 - 1),
        port=st.integers(1, 65535),
        local=st.ip_addresses().map(str),
        link_index=st.integers(0, 2**31 - 1),
        mac=MIXED_CASE_MACS,
        mtu=st.integers(68, 65535),
        learning=st.booleans(),
    )


@given(vxlan_specs())
def test_a_vxlan_device_reads_back_as_requested(spec):
    args = vxlan_request(spec)
    assert args["vxlan_learning"] == int(spec.learning)  # always sent: the default is on
    assert ("vxlan_link" in args) == bool(spec.link_index)
    have = vxlan_of(link_echo(args))
    assert have.mac == spec.mac.lower() and calc_vxlan_plan(spec, have) == "keep"


@given(vxlan_specs(), vxlan_specs())
def test_what_a_live_device_cannot_change_is_recreated(want, have):
    plan = calc_vxlan_plan(want, have)
    same_tunnel = (
        want.name,
        want.vni,
        want.port,
        ipaddress.ip_address(want.local),
        want.link_index,
        want.learning,
    ) == (
        have.name,
        have.vni,
        have.port,
        ipaddress.ip_address(have.local),
        have.link_index,
        have.learning,
    )
    assert (plan == "recreate") == (not same_tunnel)
    if same_tunnel:
        assert (plan == "keep") == ((want.mac.lower(), want.mtu) == (have.mac, have.mtu))


def test_monitor_summaries():
    route = route_echo(
        route_request(
            Route(
                dst=ipaddress.ip_network("fd22::/64"),
                oif=4,
                gw=ipaddress.ip_address("fd22::70"),
                proto=77,
            )
        )
    )
    route["event"] = DELROUTE  # what pyroute2's marshal names a message of type 25
    assert summary_of(route) == (
        DELROUTE,
        {
            "family": socket.AF_INET6,
            "dst": "fd22::/64",
            "gw": "fd22::70",
            "oif": 4,
            "proto": 77,
            "table": MAIN_TABLE,
        },
    )
    fdb = neigh_echo(fdb_request(4, "66:00:00:00:00:01", "192.168.77.2"), family=AF_BRIDGE)
    fdb["event"] = DELNEIGH
    assert summary_of(fdb)[1]["family"] == AF_BRIDGE
    link = link_echo(
        vxlan_request(VxlanSpec("pycni.1", 1, 4789, "192.168.77.1", 3, "66:11:22:33:44:55", 1450))
    )
    link["event"] = DELLINK
    assert summary_of(link) == (
        DELLINK,
        {"index": 9, "ifname": "pycni.1", "kind": "vxlan", "up": True},
    )
    new_neigh = neigh_echo(neigh_request(4, "10.0.0.1", "66:00:00:00:00:01"))
    new_neigh["event"] = "RTM_NEWNEIGH"
    assert summary_of(new_neigh) is None  # only deletions and new links

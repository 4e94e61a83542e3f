"""The underlay's pure choices (overlay.underlay) over generated routes and addresses:
what the netlink side reads is only ever chosen by these."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni.spec.errors import InvalidConfig
from overlay.underlay import (
    IFA_F_SECONDARY,
    MAIN_TABLE,
    MIN_MTU,
    OVERHEAD,
    RTN_LOCAL,
    RTN_UNICAST,
    UNUSABLE,
    AddrFacts,
    RouteFacts,
    calc_direct_reason,
    calc_overlay_mtu,
    pick_default_route,
    pick_primary_address,
)

routes = st.builds(
    RouteFacts,
    table=st.sampled_from([MAIN_TABLE, 255, 100]),
    dst_len=st.sampled_from([0, 0, 24, 32]),
    type=st.integers(0, 9),
    oif=st.none() | st.integers(1, 8),
    gateway=st.none() | st.ip_addresses().map(str),
    prefsrc=st.none() | st.ip_addresses().map(str),
    priority=st.integers(0, 2**32 - 1),
)
addrs = st.builds(
    AddrFacts,
    index=st.integers(1, 4),
    address=st.ip_addresses().map(str),
    scope=st.sampled_from([0, 0, 200, 253, 254]),
    flags=st.integers(0, 0xFF),
)


@given(st.lists(routes, max_size=12))
def test_the_default_route_is_a_main_unicast_default_of_least_metric(found):
    chosen = pick_default_route(found)
    candidates = [
        r
        for r in found
        if (r.table, r.dst_len, r.type) == (MAIN_TABLE, 0, RTN_UNICAST) and r.oif is not None
    ]
    assert (chosen is None) == (not candidates)
    if chosen is not None:
        assert chosen in candidates and chosen.priority == min(r.priority for r in candidates)


@given(
    st.lists(addrs, max_size=12),
    st.integers(1, 4),
    st.sampled_from([4, 6]),
    st.none() | st.ip_addresses().map(str),
)
def test_the_primary_address_is_a_usable_global_one_of_the_device(found, index, version, prefer):
    chosen = pick_primary_address(found, index, version, prefer)
    if chosen is None:
        return
    holders = [  # the draws may give one address twice, primary and secondary
        a
        for a in found
        if a.address == chosen and a.index == index and a.scope == 0 and not a.flags & UNUSABLE
    ]
    assert holders and ipaddress.ip_address(chosen).version == version
    assert chosen == prefer or any(not a.flags & IFA_F_SECONDARY for a in holders)


@given(st.none() | routes)
def test_direct_only_for_a_unicast_route_without_gateway(route):
    reason = calc_direct_reason(route)
    direct = route is not None and route.type == RTN_UNICAST and route.gateway is None
    assert (reason is None) == direct
    if route is not None and route.type == RTN_UNICAST and route.gateway:
        assert route.gateway in reason
    if route is not None and route.type == RTN_LOCAL:
        assert "local" in reason


@given(st.integers(0, 2**20), st.sampled_from([4, 6]))
def test_overlay_mtu_leaves_room_for_the_encapsulation_or_is_refused(mtu, version):
    if mtu - OVERHEAD[version] < MIN_MTU:
        with pytest.raises(InvalidConfig):
            calc_overlay_mtu(mtu, version)
    else:
        assert calc_overlay_mtu(mtu, version) == mtu - OVERHEAD[version]


def test_overlay_mtu_of_the_usual_underlays():
    assert (calc_overlay_mtu(1500, 4), calc_overlay_mtu(1500, 6)) == (1450, 1430)
    with pytest.raises(ValueError):
        calc_overlay_mtu(1500, 5)

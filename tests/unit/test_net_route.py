"""Shaping a route request (pure): what kernel.route sends for a Route."""

from __future__ import annotations

import ipaddress
import socket

from hypothesis import given
from hypothesis import strategies as st

from kernel.route import Route, route_request


def test_default_route_on_its_device():
    route = Route(
        dst=ipaddress.ip_network("0.0.0.0/0"), gw=ipaddress.ip_address("10.22.0.1"), oif=7
    )
    assert route_request(route) == {
        "dst": "0.0.0.0/0",
        "family": socket.AF_INET,
        "oif": 7,
        "gateway": "10.22.0.1",
    }


def test_every_field_and_metrics():
    route = Route(
        dst=ipaddress.ip_network("fd00::/8"),
        gw=ipaddress.ip_address("fd22::1"),
        oif=3,
        priority=10,
        table=100,
        scope=0,
        mtu=1400,
        advmss=1360,
    )
    assert route_request(route) == {
        "dst": "fd00::/8",
        "family": socket.AF_INET6,
        "oif": 3,
        "priority": 10,
        "table": 100,
        "scope": 0,
        "gateway": "fd22::1",
        "metrics": {"mtu": 1400, "advmss": 1360},
    }


@given(st.ip_addresses(), st.integers(0, 128), st.integers(1, 2**31 - 1))
def test_request_names_the_device_and_family(address, prefixlen, oif):
    dst = ipaddress.ip_network(f"{address}/{min(prefixlen, address.max_prefixlen)}", strict=False)
    args = route_request(Route(dst=dst, oif=oif))
    assert args == {
        "dst": str(dst),
        "oif": oif,
        "family": socket.AF_INET if dst.version == 4 else socket.AF_INET6,
    }

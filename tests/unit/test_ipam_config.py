"""pycni-ipam netconf parsing: every problem is code 7 naming the key."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni.spec.errors import InvalidConfig
from plugins.ipam.config import parse_ipam_config
from plugins.ipam.requested import parse_requested_ips, requested_by_set


def conf(ipam: dict, **extra) -> dict:
    return {
        "cniVersion": "1.0.0",
        "name": "net",
        "type": "bridge",
        "ipam": {"type": "pycni-ipam", **ipam},
        **extra,
    }


def bad(config: dict) -> InvalidConfig:
    with pytest.raises(InvalidConfig) as info:
        parse_ipam_config(config)
    assert info.value.code == 7
    return info.value


def test_host_local_defaults():
    cfg = parse_ipam_config(conf({"ranges": [[{"subnet": "10.22.0.0/16"}]]}))
    ((r,),) = cfg.range_sets
    assert (str(r.start), str(r.end), str(r.gateway)) == (
        "10.22.0.1",
        "10.22.255.254",
        "10.22.0.1",
    )
    assert r.where == "ipam.ranges[0][0]"


def test_ipv6_defaults_reach_the_last_address():
    cfg = parse_ipam_config(conf({"ranges": [[{"subnet": "fd00::/64"}]]}))
    ((r,),) = cfg.range_sets
    assert str(r.end) == "fd00::ffff:ffff:ffff:ffff" and str(r.gateway) == "fd00::1"


def test_dual_stack_and_explicit_limits():
    cfg = parse_ipam_config(
        conf(
            {
                "ranges": [
                    [
                        {
                            "subnet": "10.1.0.0/24",
                            "rangeStart": "10.1.0.10",
                            "rangeEnd": "10.1.0.20",
                            "gateway": "10.1.0.254",
                        }
                    ],
                    [{"subnet": "fd01::/64"}],
                ]
            }
        )
    )
    assert [r[0].subnet.version for r in cfg.range_sets] == [4, 6]
    assert str(cfg.range_sets[0][0].gateway) == "10.1.0.254"


def test_shorthand_subnet_is_prepended_as_its_own_set():
    cfg = parse_ipam_config(
        conf(
            {
                "subnet": "10.9.0.0/24",
                "gateway": "10.9.0.254",
                "ranges": [[{"subnet": "fd00::/64"}]],
            }
        )
    )
    assert [str(s[0].subnet) for s in cfg.range_sets] == ["10.9.0.0/24", "fd00::/64"]
    assert cfg.range_sets[0][0].where == "ipam"


def test_ip_ranges_capability_replaces_the_ranges():
    cfg = parse_ipam_config(
        conf(
            {"ranges": [[{"subnet": "10.1.0.0/24"}]]},
            runtimeConfig={"ipRanges": [[{"subnet": "10.7.0.0/24"}]]},
        )
    )
    assert str(cfg.range_sets[0][0].subnet) == "10.7.0.0/24"
    assert cfg.range_sets[0][0].where == "runtimeConfig.ipRanges[0][0]"


def test_routes_and_dns_pass_through():
    cfg = parse_ipam_config(
        conf(
            {
                "ranges": [[{"subnet": "10.1.0.0/24"}]],
                "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.1.0.254"}],
                "dns": {"nameservers": ["10.1.0.53"], "domain": "x"},
            }
        )
    )
    assert cfg.routes == ({"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.1.0.254"})
    assert cfg.dns == {"nameservers": ["10.1.0.53"], "domain": "x"}


@pytest.mark.parametrize(
    "ipam, key, words",
    [
        ({"ranges": []}, "no address range", "ipam.ranges"),
        ({"pools": "v4"}, "ipam.pools", "non-empty list of pool names"),
        ({"pools": []}, "ipam.pools", "non-empty list"),
        ({"pools": ["v4", 7]}, "ipam.pools", "pool names"),
        ({"pools": ["v4"], "ranges": [[{"subnet": "10.0.0.0/24"}]]}, "ipam.pools", "not both"),
        ({"pools": ["v4"], "subnet": "10.0.0.0/24"}, "ipam.pools", "not both"),
        ({"ranges": "10.0.0.0/8"}, "ipam.ranges", "list of range sets"),
        ({"ranges": [[]]}, "ipam.ranges[0]", "non-empty"),
        ({"ranges": [[{"gateway": "10.0.0.1"}]]}, "ipam.ranges[0][0].subnet", "CIDR"),
        ({"ranges": [[{"subnet": "10.0.0.0"}]]}, "ipam.ranges[0][0].subnet", "CIDR"),
        ({"ranges": [[{"subnet": "10.0.0.300/24"}]]}, "ipam.ranges[0][0].subnet", "not a CIDR"),
        ({"ranges": [[{"subnet": "10.0.0.5/24"}]]}, "ipam.ranges[0][0].subnet", "host bits"),
        ({"ranges": [[{"subnet": "10.0.0.0/31"}]]}, "ipam.ranges[0][0].subnet", "too small"),
        ({"ranges": [[{"subnet": "fd00::/127"}]]}, "ipam.ranges[0][0].subnet", "too small"),
        (
            {"ranges": [[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.5"}]]},
            "ipam.ranges[0][0].rangeStart",
            "not in network",
        ),
        (
            {"ranges": [[{"subnet": "10.0.0.0/24", "rangeEnd": "fd00::5"}]]},
            "ipam.ranges[0][0].rangeEnd",
            "same IP family",
        ),
        (
            {
                "ranges": [
                    [{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.9", "rangeEnd": "10.0.0.8"}]
                ]
            },
            "ipam.ranges[0][0].rangeStart",
            "after rangeEnd",
        ),
        (
            {"ranges": [[{"subnet": "10.0.0.0/24", "gateway": "nope"}]]},
            "ipam.ranges[0][0].gateway",
            "not an IP",
        ),
        (
            {"ranges": [[{"subnet": "10.0.0.0/24", "blockSize": "26"}]]},
            "ipam.ranges[0][0].blockSize",
            "prefix length",
        ),
        (
            {"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]},
            "ipam.ranges[0][1]",
            "mixes IPv4 and IPv6",
        ),
        (
            {"ranges": [[{"subnet": "10.0.0.0/16"}], [{"subnet": "10.0.5.0/24"}]]},
            "ipam.ranges[1][0]",
            "overlaps ipam.ranges[0][0]",
        ),
        (
            {
                "ranges": [
                    [
                        {"subnet": "10.0.0.0/24", "rangeEnd": "10.0.0.50"},
                        {"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.40"},
                    ]
                ]
            },
            "ipam.ranges[0][1]",
            "overlaps",
        ),
        (
            {"ranges": [[{"subnet": "10.0.0.0/24"}]], "routes": [{"gw": "10.0.0.1"}]},
            "ipam.routes[0]",
            "dst",
        ),
        (
            {"ranges": [[{"subnet": "10.0.0.0/24"}]], "routes": [{"dst": "bogus"}]},
            "ipam.routes[0].dst",
            "not a CIDR",
        ),
        (
            {"ranges": [[{"subnet": "10.0.0.0/24"}]], "dns": {"nameservers": "10.0.0.53"}},
            "ipam.dns.nameservers",
            "list of strings",
        ),
    ],
)
def test_config_errors_name_the_key(ipam, key, words):
    err = bad(conf(ipam))
    assert key in f"{err.msg} {err.details}" and words in f"{err.msg} {err.details}"


def test_cluster_pools_by_name_or_by_node_selector():
    named = parse_ipam_config(conf({"pools": ["v4", "v6"]}))
    assert named.range_sets == () and named.pools == ("v4", "v6")
    assert named.selection.mode == "pools"
    selected = parse_ipam_config(conf({}))  # neither pools nor ranges: node selectors
    assert selected.selection.mode == "selector" and selected.selection.network == "net"
    ranged = parse_ipam_config(conf({"ranges": [[{"subnet": "10.0.0.0/24"}]]}))
    assert ranged.selection.mode == "ranges"


def test_ip_ranges_capability_wins_over_named_pools():
    cfg = parse_ipam_config(
        conf({"pools": ["v4"]}, runtimeConfig={"ipRanges": [[{"subnet": "10.7.0.0/24"}]]})
    )
    assert cfg.pools == () and str(cfg.range_sets[0][0].subnet) == "10.7.0.0/24"


def test_daemon_options_labels_and_housekeeping():
    from plugins.ipam.config import parse_daemon_options

    opts = parse_daemon_options(
        {"nodeLabels": {"zone": "a"}, "ipam": {"blockReturnGrace": 60, "bufferSize": 8}}
    )
    assert opts.labels == {"zone": "a"} and opts.block_grace == 60.0
    assert opts.housekeeping_interval == 30.0
    for raw, key in (
        ({"nodeLabels": {"zone": 1}}, "nodeLabels"),
        ({"ipam": {"blockReturnGrace": -1}}, "ipam.blockReturnGrace"),
        ({"ipam": {"housekeepingInterval": "30"}}, "ipam.housekeepingInterval"),
    ):
        with pytest.raises(InvalidConfig, match=key):
            parse_daemon_options(raw)


def test_disjoint_ranges_of_one_subnet_in_one_set_are_fine():
    cfg = parse_ipam_config(
        conf(
            {
                "ranges": [
                    [
                        {"subnet": "10.0.0.0/24", "rangeEnd": "10.0.0.50"},
                        {"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.51"},
                    ]
                ]
            }
        )
    )
    assert len(cfg.range_sets[0]) == 2


def requested(config: dict, args: dict | None = None):
    cfg = parse_ipam_config(config)
    return requested_by_set(cfg, parse_requested_ips(config, args or {}))


DUAL = {"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "fd00::/64"}]]}


def test_requested_from_every_source_map_to_their_sets():
    got = requested(conf(DUAL, runtimeConfig={"ips": ["fd00::50/64"]}), {"IP": "10.0.0.9"})
    assert got == {0: ipaddress.ip_address("10.0.0.9"), 1: ipaddress.ip_address("fd00::50")}
    got = requested(conf(DUAL, args={"cni": {"ips": ["10.0.0.7"]}}))
    assert got == {0: ipaddress.ip_address("10.0.0.7")}
    got = requested(conf(DUAL), {"IP": "10.0.0.9,fd00::9"})
    assert set(map(str, got.values())) == {"10.0.0.9", "fd00::9"}


def test_same_address_from_two_sources_counts_once():
    got = requested(conf(DUAL, runtimeConfig={"ips": ["10.0.0.9/24"]}), {"IP": "10.0.0.9"})
    assert got == {0: ipaddress.ip_address("10.0.0.9")}


@pytest.mark.parametrize(
    "config, args, words",
    [
        (conf(DUAL), {"IP": "10.9.9.9"}, "outside every range"),
        (conf(DUAL), {"IP": "10.0.0.1"}, "is a gateway"),
        (conf(DUAL), {"IP": "10.0.0.255"}, "outside every range"),
        (conf(DUAL), {"IP": "10.0.0.5,10.0.0.6"}, "two addresses requested from range set 0"),
        (conf(DUAL), {"IP": "not-an-ip"}, "CNI_ARGS IP"),
        (conf(DUAL, runtimeConfig={"ips": ["10.0.0.5", 7]}), {}, "runtimeConfig.ips[1]"),
        (conf(DUAL, args={"cni": {"ips": "10.0.0.5"}}), {}, "args.cni.ips"),
    ],
)
def test_bad_requested_addresses_are_invalid_config(config, args, words):
    with pytest.raises(InvalidConfig) as info:
        requested(config, args)
    assert words in f"{info.value.msg} {info.value.details}"


RANGE = {"ranges": [[{"subnet": "10.0.0.0/24"}]]}


@pytest.mark.parametrize(
    "route,key",
    [
        ({"dst": "0.0.0.0/0", "table": 2**32}, "ipam.routes[0].table"),
        ({"dst": "0.0.0.0/0", "table": -1}, "ipam.routes[0].table"),
        ({"dst": "0.0.0.0/0", "priority": 2**32}, "ipam.routes[0].priority"),
        ({"dst": "0.0.0.0/0", "mtu": 2**40}, "ipam.routes[0].mtu"),
        ({"dst": "0.0.0.0/0", "advmss": -5}, "ipam.routes[0].advmss"),
        ({"dst": "0.0.0.0/0", "scope": 256}, "ipam.routes[0].scope"),
        ({"dst": "0.0.0.0/0", "scope": 1.0}, "ipam.routes[0].scope"),
        ({"dst": "0.0.0.0/0", "gw": 5}, "ipam.routes[0].gw"),
        ({"dst": "0.0.0.0/0", "gw": "fd00::1"}, "ipam.routes[0].gw"),
    ],
)
def test_route_values_netlink_cannot_carry_are_refused(route, key):
    """u32 for table/priority/mtu/advmss, u8 for scope, a gateway of the dst's family."""
    assert bad(conf({**RANGE, "routes": [route]})).msg == f"invalid {key}"


def test_route_values_at_the_limits_are_kept():
    route = {"dst": "10.9.0.0/16", "table": 2**32 - 1, "priority": 0, "scope": 255, "mtu": 9000}
    assert parse_ipam_config(conf({**RANGE, "routes": [route]})).routes == (route,)


@pytest.mark.parametrize("value", [5, True, 167772165])
def test_a_requested_ip_that_is_a_number_is_refused(value):
    """ipaddress reads an int as an address (5 -> 0.0.0.5): only strings are addresses."""
    with pytest.raises(InvalidConfig, match=r"runtimeConfig.ips\[0\]"):
        parse_requested_ips({"runtimeConfig": {"ips": [value]}}, {})


IPAM_KEYS = st.sampled_from(
    [
        "ranges",
        "subnet",
        "rangeStart",
        "rangeEnd",
        "gateway",
        "pools",
        "routes",
        "dns",
        "blockSize",
        "dst",
        "gw",
        "table",
        "scope",
        "nameservers",
        "domain",
    ]
)
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.sampled_from(["10.0.0.0/24", "10.0.0.1", "fd00::/64", "0.0.0.0/0", "x", ""]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(IPAM_KEYS, inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(IPAM_KEYS, VALUES, max_size=5), VALUES)
def test_any_ipam_config_parses_or_is_code_7(ipam, runtime):
    config = conf(ipam, runtimeConfig={"ipRanges": runtime, "ips": runtime})
    try:
        parse_ipam_config(config)
        parse_requested_ips(config, {})
    except InvalidConfig as err:
        assert err.code == 7 and err.msg.startswith("invalid")

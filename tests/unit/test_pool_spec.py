"""Pool records, pure: validation of every setting, and what a pool can ever hand out."""

from __future__ import annotations

import ipaddress

import pytest

from ipam.alloc.intervals import count, fully_covered_blocks, intersect, merge, subtract
from ipam.alloc.pool_settings import PoolInvalid, normalize_exclusion, parse_node_selector
from ipam.alloc.pool_spec import make_pool, record_of, render_selector, spec_from_record

net = ipaddress.ip_network
ip = ipaddress.ip_address


def brute_size(spec) -> int:
    """Count by enumerating every address (small pools only)."""
    total = 0
    for base in range(
        int(spec.cidr.network_address),
        int(spec.cidr.broadcast_address) + 1,
        1 << (spec.cidr.max_prefixlen - spec.block_size),
    ):
        total += spec.block_capacity(ipaddress.ip_network((base, spec.block_size)))
    return total


def test_intervals():
    assert merge([(5, 6), (1, 2), (3, 4), (10, 12), (11, 20)]) == [(1, 6), (10, 20)]
    assert merge([(1, 2), (4, 4)]) == [(1, 2), (4, 4)]
    assert intersect([(1, 6), (10, 20)], (4, 11)) == [(4, 6), (10, 11)]
    assert subtract([(0, 20)], [(0, 0), (5, 7), (20, 20)]) == [(1, 4), (8, 19)]
    assert count([(1, 4), (8, 19)]) == 16
    # blocks of 4 addresses (/30 in a /32 space): [4,11] covers two blocks, [1,6] none
    assert fully_covered_blocks([(4, 11)], 30, 32) == 2
    assert fully_covered_blocks([(1, 6)], 30, 32) == 0
    assert fully_covered_blocks([(0, 3), (8, 8)], 30, 32) == 1


def test_defaults():
    spec = make_pool("v4", "10.244.0.0/16")
    assert (spec.block_size, spec.gateway, spec.reuse_delay, spec.disabled) == (
        26,
        "none",
        120,
        False,
    )
    assert spec.size == 65536 - 2 and spec.reserved == 2
    assert make_pool("v6", "fd00:10::/64").block_size == 122
    assert make_pool("small", "10.0.0.0/28").block_size == 28  # default narrowed to the pool
    assert make_pool("small6", "fd00::/124").block_size == 124


@pytest.mark.parametrize(
    "cidr,size,message",
    [
        ("10.0.0.0/16", 19, "IPv4 blocks are /20 to /32"),
        ("10.0.0.0/16", 33, "IPv4 blocks are /20 to /32"),
        ("fd00::/64", 115, "IPv6 blocks are /116 to /128"),
        ("fd00::/64", 129, "IPv6 blocks are /116 to /128"),
        ("10.0.0.0/28", 26, "/26 blocks are larger than pool 10.0.0.0/28"),
        ("fd00::/124", 122, "/122 blocks are larger than pool fd00::/124"),
    ],
)
def test_block_size_limits(cidr, size, message):
    with pytest.raises(PoolInvalid, match=message) as info:
        make_pool("p", cidr, block_size=size)
    assert "blockSize" in str(info.value)


@pytest.mark.parametrize(
    "cidr,size", [("10.0.0.0/16", 20), ("10.0.0.0/16", 32), ("fd00::/64", 116), ("fd00::/64", 128)]
)
def test_block_size_limits_inclusive(cidr, size):
    assert make_pool("p", cidr, block_size=size).block_size == size


@pytest.mark.parametrize(
    "cidr,message",
    [
        ("10.0.0.1/24", "host bits set; did you mean 10.0.0.0/24"),
        ("10.0.0.0", "expected a CIDR"),
        ("bogus/8", "is not a CIDR"),
        ("10.0.0.0/31", "no address of 10.0.0.0/31 could ever be handed out"),
    ],
)
def test_bad_cidrs(cidr, message):
    with pytest.raises(PoolInvalid, match=message):
        make_pool("p", cidr)


@pytest.mark.parametrize("name", ["", "-x", "_buffer", "a/b", "a b", "x" * 64])
def test_bad_names(name):
    with pytest.raises(PoolInvalid, match="pool name"):
        make_pool(name, "10.0.0.0/24")


def test_exclusions_are_validated_and_normalized():
    cidr = net("10.0.0.0/24")
    assert normalize_exclusion("10.0.0.0/30", cidr) == "10.0.0.0/30"
    assert normalize_exclusion("10.0.0.7/32", cidr) == "10.0.0.7/32"
    assert normalize_exclusion("10.0.0.7", cidr) == "10.0.0.7/32"
    assert normalize_exclusion("10.0.0.5 - 10.0.0.9", cidr) == "10.0.0.5-10.0.0.9"
    assert normalize_exclusion("10.0.0.5-10.0.0.5", cidr) == "10.0.0.5/32"
    for bad, message in (
        ("10.0.1.0/30", "not inside pool"),
        ("10.0.0.9-10.0.0.5", "is after"),
        ("fd00::1", "IP family"),
        ("10.0.0.1/30", "CIDR"),
        ("nonsense", "CIDR"),
    ):
        with pytest.raises(PoolInvalid, match=message):
            normalize_exclusion(bad, cidr)
    spec = make_pool("p", "10.0.0.0/24", exclusions=["10.0.0.7", "10.0.0.7/32", "10.0.0.0/30"])
    assert spec.exclusions == ("10.0.0.7/32", "10.0.0.0/30")


def test_size_with_exclusions_and_block_gateways():
    spec = make_pool(
        "p", "10.0.0.0/24", gateway="first", exclusions=["10.0.0.0/30", "10.0.0.100-10.0.0.110"]
    )
    # excluded: .0-.3, .100-.110, broadcast .255 = 16; gateways: one per /26 block = 4
    assert spec.size == 256 - 16 - 4 and spec.reserved == 20
    assert spec.block_gateway(net("10.0.0.0/26")) == ip("10.0.0.4")  # first not excluded
    assert spec.block_gateway(net("10.0.0.64/26")) == ip("10.0.0.64")
    assert spec.block_capacity(net("10.0.0.0/26")) == 64 - 4 - 1
    assert spec.block_capacity(net("10.0.0.192/26")) == 64 - 1 - 1
    assert spec.size == brute_size(spec)


def test_block_entirely_excluded_has_no_gateway():
    spec = make_pool("p", "10.0.0.0/24", gateway="first", exclusions=["10.0.0.64/26"])
    assert spec.block_gateway(net("10.0.0.64/26")) is None
    assert spec.block_capacity(net("10.0.0.64/26")) == 0
    assert spec.size == brute_size(spec) == 256 - 64 - 2 - 3


@pytest.mark.parametrize(
    "kw",
    [
        {
            "cidr": "10.0.0.0/22",
            "block_size": 28,
            "gateway": "first",
            "exclusions": ["10.0.0.0/27", "10.0.1.3-10.0.2.200", "10.0.3.255"],
        },
        {"cidr": "10.0.0.0/24", "block_size": 31, "gateway": "first", "exclusions": ["10.0.0.9"]},
        {
            "cidr": "fd00::/116",
            "block_size": 120,
            "gateway": "first",
            "exclusions": ["fd00::100/120", "fd00::5-fd00::20"],
        },
        {"cidr": "fd00::/120", "block_size": 124},
    ],
)
def test_size_matches_sum_of_block_capacities(kw):
    spec = make_pool("p", **kw)
    assert spec.size == brute_size(spec)


def test_ipv6_size_is_exact_and_cheap():
    plain = make_pool("p", "fd00::/64")
    gated = make_pool("p", "fd00::/64", gateway="first", exclusions=["fd00::/120"])
    assert plain.size == 2**64
    # one /120 excluded = 256 addresses = 4 whole /122 blocks, which then have no gateway
    assert gated.size == 2**64 - 256 - (2**58 - 4)


def test_unallocatable_reasons():
    spec = make_pool("p", "10.0.0.0/24", gateway="first", exclusions=["10.0.0.100-10.0.0.110"])
    assert spec.unallocatable_reason(ip("10.0.0.0")) == "the pool's network or broadcast address"
    assert spec.unallocatable_reason(ip("10.0.0.1")) == "the gateway of block 10.0.0.0/26"
    assert spec.unallocatable_reason(ip("10.0.0.105")) == "excluded (10.0.0.100-10.0.0.110)"
    assert spec.unallocatable_reason(ip("10.0.0.2")) is None


def test_node_selector_parsing():
    assert parse_node_selector(["zone=a", "kubernetes.io/os=linux", "empty="]) == {
        "zone": "a",
        "kubernetes.io/os": "linux",
        "empty": "",
    }
    for bad in ("novalue", "=x", "a=b c", "k=v/w"):
        with pytest.raises(PoolInvalid, match="node selector"):
            parse_node_selector([bad])
    with pytest.raises(PoolInvalid, match="given twice"):
        parse_node_selector(["a=1", "a=2"])
    assert render_selector({}) == "all()" and render_selector({"b": "2", "a": "1"}) == "a=1,b=2"


def test_other_settings_validated():
    with pytest.raises(PoolInvalid, match="gateway"):
        make_pool("p", "10.0.0.0/24", gateway="last")
    for bad in (-1, 86401, "soon", True):
        with pytest.raises(PoolInvalid, match="reuseDelay"):
            make_pool("p", "10.0.0.0/24", reuse_delay=bad)


def test_record_round_trip():
    spec = make_pool(
        "p",
        "10.0.0.0/24",
        block_size=28,
        node_selector={"zone": "a"},
        disabled=True,
        strict_affinity=True,
        exclusions=["10.0.0.5"],
        gateway="first",
        reuse_delay=30,
        created_at=1700000000.0,
    )
    record = record_of(spec)
    assert record == {
        "name": "p",
        "cidr": "10.0.0.0/24",
        "blockSize": 28,
        "disabled": True,
        "nodeSelector": {"zone": "a"},
        "strictAffinity": True,
        "exclusions": ["10.0.0.5/32"],
        "gateway": "first",
        "reuseDelay": 30,
        "createdAt": 1700000000.0,
    }
    assert spec_from_record(record) == spec


def test_netconf_record_is_read_with_its_ranges():
    record = {
        "name": "net-10.22.0.0-24",
        "network": "net",
        "cidr": "10.22.0.0/24",
        "blockSize": 26,
        "disabled": False,
        "nodeSelector": "all()",
        "source": "netconf",
        "ranges": [{"rangeStart": "10.22.0.10", "rangeEnd": "10.22.0.19", "gateway": "10.22.0.1"}],
    }
    spec = spec_from_record(record)
    assert (spec.source, spec.network, spec.node_selector, spec.strict_affinity) == (
        "netconf",
        "net",
        {},
        True,
    )
    assert spec.size == 10 and spec.reserved == 246
    assert spec.unallocatable_reason(ip("10.22.0.20")) == "outside the pool's ranges"
    with_gw = {
        **record,
        "ranges": [{"rangeStart": "10.22.0.1", "rangeEnd": "10.22.0.19", "gateway": "10.22.0.1"}],
    }
    assert spec_from_record(with_gw).size == 18


def test_corrupt_records_name_the_setting():
    with pytest.raises(PoolInvalid, match="pool p cidr"):
        spec_from_record({"name": "p", "cidr": 7})
    with pytest.raises(PoolInvalid, match="pool p blockSize"):
        spec_from_record({"name": "p", "cidr": "10.0.0.0/24", "blockSize": 8})


def test_gateway_first_with_single_address_blocks_is_refused():
    with pytest.raises(PoolInvalid, match="could ever be handed out"):
        make_pool("p", "10.0.0.0/24", block_size=32, gateway="first")

"""The gateway rule, so no Pod is ever given an address a bridge holds: the IPAM reserves every
gateway it returns and never hands it out, for every pool shape; a main plugin with isGateway gets
a gateway with every address or a code 7 naming the pool; the bridge never takes a Pod's own
address as its gateway.

Allocator-level properties run on a real SqliteStore (one per example) with one to three
LeaseServices (nodes) on it, so blocks are claimed by several nodes and borrowed."""

from __future__ import annotations

import ipaddress
import itertools
import tempfile

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cni.spec.errors import AddressExhausted, InvalidConfig
from ipam.alloc.pool_settings import PoolInvalid
from ipam.alloc.pool_spec import make_pool
from ipam.alloc.selection import Selection
from ipam.leases.service import LeaseService
from ipam.records import HandleId
from plugins.bridge.calc import calc_ips, calc_pod_on_bridge
from plugins.ipam.config import cached_ipam_config, parse_ipam_config
from store.sqlite import SqliteStore
from tests.fixtures.ipam_pools import put_pool

PROPERTY = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def fill(nodes: list[LeaseService], selection) -> list:
    """Lease until every node is refused with AddressExhausted; the records, in order."""
    records, done, counter = [], set(), itertools.count()
    while len(done) < len(nodes):
        for index, leases in enumerate(nodes):
            if index in done:
                continue
            try:
                record, _ = leases.acquire(HandleId("net", f"c{next(counter)}", "eth0"), selection)
            except AddressExhausted:
                done.add(index)
                continue
            records.append(record)
    return records


def assert_gateways_reserved(records: list) -> set[str]:
    """No leased address is another's gateway; every lease has a gateway. The gateways."""
    leased = [ip.ip for r in records for ip in r.ips]
    gateways = {ip.gateway for r in records for ip in r.ips}
    assert len(leased) == len(set(leased)), "an address was leased twice"
    assert None not in gateways, "a lease came without a gateway"
    assert not gateways & set(leased), f"gateways handed out: {gateways & set(leased)}"
    return gateways


def open_nodes(path: str, count: int) -> tuple[SqliteStore, list[LeaseService]]:
    store = SqliteStore(path)
    return store, [LeaseService(store, f"node{i + 1}") for i in range(count)]


# -- cluster pools, gateway "first" ---------------------------------------------------------


@st.composite
def cluster_pools(draw):
    v6 = draw(st.booleans())
    prefix = draw(st.integers(26, 29)) + (96 if v6 else 0)
    block = draw(st.integers(prefix, min(prefix + 3, 128 if v6 else 31)))
    cidr = ipaddress.ip_network(f"{'fd00:6::' if v6 else '10.6.0.0'}/{prefix}")
    hosts = list(cidr)
    excluded = draw(st.lists(st.sampled_from(hosts), max_size=4, unique=True))
    return str(cidr), block, [str(ip) for ip in excluded]


@PROPERTY
@given(shape=cluster_pools(), count=st.integers(1, 3))
def test_gateway_first_pools_never_hand_out_a_gateway(shape, count):
    cidr, block, excluded = shape
    try:
        spec = make_pool("p", cidr, block_size=block, exclusions=excluded, gateway="first")
    except PoolInvalid:
        assume(False)
    with tempfile.TemporaryDirectory() as tmp:
        store, nodes = open_nodes(f"{tmp}/s.db", count)
        try:
            put_pool(store, "p", cidr, block_size=block, exclusions=excluded, gateway="first")
            records = fill(nodes, Selection("net", pools=("p",), gateway_key="isGateway"))
        finally:
            store.close()
    gateways = assert_gateways_reserved(records)
    assert len(records) == spec.size  # everything was handed out
    for gw in gateways:
        assert spec.unallocatable_reason(ipaddress.ip_address(gw)), f"{gw} is not reserved"
    for record in records:  # each address comes with its own block's gateway
        (ip,) = record.ips
        assert ip.gateway == str(spec.block_gateway(spec.block_of(ipaddress.ip_address(ip.ip))))


# -- netconf ranges ---------------------------------------------------------------------------


@st.composite
def range_sets(draw):
    """1-3 range sets of 1-2 ranges over distinct small subnets, with rangeStart/rangeEnd and
    explicit gateways sometimes."""
    subnets = iter(ipaddress.ip_network("10.7.0.0/22").subnets(new_prefix=27))
    sets = []
    for _ in range(draw(st.integers(1, 3))):
        items = []
        for _ in range(draw(st.integers(1, 2))):
            subnet = next(subnets)
            hosts = list(subnet.hosts())
            item = {"subnet": str(subnet)}
            if draw(st.booleans()):
                start = draw(st.integers(0, len(hosts) - 2))
                end = draw(st.integers(start, len(hosts) - 1))
                item.update(rangeStart=str(hosts[start]), rangeEnd=str(hosts[end]))
            if draw(st.booleans()):
                item["gateway"] = str(draw(st.sampled_from(hosts)))
            item["blockSize"] = draw(st.integers(27, 29))
            items.append(item)
        sets.append(items)
    return sets


@PROPERTY
@given(sets=range_sets(), count=st.integers(1, 2))
def test_netconf_ranges_never_hand_out_a_gateway(sets, count):
    cfg = parse_ipam_config({"name": "net", "isGateway": True, "ipam": {"ranges": sets}})
    assume(all(r.start != r.end or r.start != r.gateway for rs in cfg.range_sets for r in rs))
    with tempfile.TemporaryDirectory() as tmp:
        store, nodes = open_nodes(f"{tmp}/s.db", count)
        try:
            records = fill(nodes, cfg.selection)
        finally:
            store.close()
    assume(records)  # a set whose only address is its gateway leaves nothing to hand out
    assert_gateways_reserved(records)
    ranges = [r for rs in cfg.range_sets for r in rs]
    for record in records:
        assert len(record.ips) == len(cfg.range_sets)
        for ip in record.ips:  # the gateway is the one of the range the address came from
            address = ipaddress.ip_address(ip.ip)
            assert ip.gateway in {str(r.gateway) for r in ranges if r.contains(address)}
            assert address not in {r.gateway for r in ranges}


def test_explicit_gateway_outside_its_subnet_is_refused():
    with pytest.raises(InvalidConfig) as err:
        parse_ipam_config(
            {"name": "n", "ipam": {"ranges": [[{"subnet": "10.1.0.0/24", "gateway": "10.2.0.1"}]]}}
        )
    assert err.value.code == 7 and "ipam.ranges[0][0].gateway" in err.value.msg
    assert "not a host address of network 10.1.0.0/24" in err.value.details
    with pytest.raises(InvalidConfig, match="ipam.gateway"):  # the broadcast address
        parse_ipam_config(
            {"name": "n", "ipam": {"subnet": "10.1.0.0/24", "gateway": "10.1.0.255"}}
        )


# -- gateway "none" under isGateway -------------------------------------------------------------


@pytest.mark.parametrize("key", ["isGateway", "isDefaultGateway"])
def test_pool_without_gateways_under_is_gateway_is_refused_before_anything_is_written(
    tmp_path, key
):
    store, (leases,) = open_nodes(str(tmp_path / "s.db"), 1)
    put_pool(store, "nogw", "10.8.0.0/28", gateway="none")
    before = [kv.key for kv in store.range("/pycni/v1/")]
    cfg = parse_ipam_config({"name": "net", key: True, "ipam": {"pools": ["nogw"]}})
    with pytest.raises(InvalidConfig) as err:
        leases.acquire(HandleId("net", "c1", "eth0"), cfg.selection)
    assert err.value.code == 7
    assert err.value.msg == f"pool nogw hands out no gateway, but the netconf sets {key}"
    assert "pycni ipam pool set nogw --gateway first" in err.value.details
    assert [kv.key for kv in store.range("/pycni/v1/")] == before  # no block, no handle
    plain = parse_ipam_config({"name": "net", "ipam": {"pools": ["nogw"]}})
    record, _ = leases.acquire(HandleId("net", "c1", "eth0"), plain.selection)
    assert record.ips[0].gateway is None  # without isGateway the pool serves as before
    store.close()


def test_the_gateway_key_is_part_of_the_cached_config():
    ipam = {"pools": ["p"]}
    assert cached_ipam_config({"name": "n", "ipam": ipam}).gateway_key == ""
    assert (
        cached_ipam_config({"name": "n", "isGateway": True, "ipam": ipam}).gateway_key
        == "isGateway"
    )
    assert cached_ipam_config({"name": "n", "isGateway": "yes", "ipam": ipam}).gateway_key == ""


# -- pycni-bridge ---------------------------------------------------------------------------------


def test_bridge_refuses_a_gateway_that_is_the_pods_own_address():
    with pytest.raises(InvalidConfig) as err:
        calc_ips([{"address": "10.9.0.5/24", "gateway": "10.9.0.5"}], is_gateway=False)
    assert err.value.code == 7 and "own address 10.9.0.5/24 as its gateway" in err.value.msg


def test_bridge_fallback_gateway_equal_to_the_pods_address_is_refused():
    with pytest.raises(InvalidConfig) as err:  # a foreign IPAM, no gateway, isGateway
        calc_ips([{"address": "10.9.0.1/24"}], is_gateway=True)
    assert err.value.code == 7 and "first address 10.9.0.1" in err.value.msg
    assert calc_ips([{"address": "10.9.0.2/24"}], True)[0]["gateway"] == "10.9.0.1"


def test_pod_addresses_held_by_the_bridge_are_found():
    iface = ipaddress.ip_interface
    bridge = [iface("10.9.0.1/24"), iface("10.9.0.64/24"), iface("fe80::1/64")]
    assert calc_pod_on_bridge([iface("10.9.0.64/26")], bridge) == [
        (iface("10.9.0.64/26"), iface("10.9.0.64/24"))
    ]
    assert calc_pod_on_bridge([iface("10.9.0.2/24"), iface("fd00::2/64")], bridge) == []

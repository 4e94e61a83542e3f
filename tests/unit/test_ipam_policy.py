"""Allocation policy for cluster pools, pure: exclusions, gateway "first", the order of
preference (own, claim, borrow, cooling), strictAffinity, reuse delay, seeded block claims,
node selectors and static requests."""

from __future__ import annotations

import ipaddress
import itertools

import pytest

from cni.spec.errors import AddressExhausted, InvalidConfig
from ipam.alloc.allocator import Pool, iter_candidate_blocks, pick_address, pool_from_record
from ipam.alloc.policy import BORROW, CLAIM, OWN, StaticView, choose_address
from ipam.alloc.pool_spec import make_pool, record_of
from ipam.alloc.selection import (
    assign_requested,
    group_by_family,
    matches,
    select_by_labels,
    select_by_name,
)
from ipam.records import BlockRecord

net = ipaddress.ip_network
ip = ipaddress.ip_address


def pool(name: str = "p", cidr: str = "10.0.0.0/24", **settings) -> Pool:
    return pool_from_record(record_of(make_pool(name, cidr, **settings)))


def block(p: Pool, cidr: str, node: str, allocations=(), released=None) -> BlockRecord:
    return BlockRecord(
        p.name, cidr, node, {a: f"h-{a}" for a in allocations}, released=released or {}
    )


def full(p: Pool, cidr: str, node: str) -> BlockRecord:
    return block(p, cidr, node, [str(a) for a in drain(p, cidr)])


def drain(p: Pool, cidr: str) -> list:
    held: dict[str, str] = {}
    last = None
    while (a := pick_address(p, net(cidr), held, last)) is not None:
        held[str(a)] = "h"
        last = str(a)
    return [ip(a) for a in held]


def test_exclusions_are_never_handed_out():
    p = pool(exclusions=["10.0.0.0/28", "10.0.0.20-10.0.0.22", "10.0.0.40"], block_size=26)
    got = drain(p, "10.0.0.0/26")
    assert got[0] == ip("10.0.0.16") and ip("10.0.0.20") not in got
    assert ip("10.0.0.23") in got and ip("10.0.0.40") not in got
    assert len(got) == 64 - 16 - 3 - 1 == p.capacity("10.0.0.0/26")
    assert not p.allocatable(ip("10.0.0.21")) and p.allocatable(ip("10.0.0.23"))


def test_a_fully_excluded_block_is_never_a_candidate():
    p = pool(cidr="10.0.0.0/25", block_size=26, exclusions=["10.0.0.0/26"])
    assert list(iter_candidate_blocks(p, set(), seed=7)) == [net("10.0.0.64/26")]


def test_gateway_first_reserves_each_blocks_first_usable_address():
    p = pool(cidr="10.0.0.0/24", block_size=26, gateway="first")
    first = drain(p, "10.0.0.0/26")
    assert first[0] == ip("10.0.0.2")  # .0 is the pool's network, .1 the gateway
    assert p.gateway_for(ip("10.0.0.9")) == ip("10.0.0.1")
    second = drain(p, "10.0.0.64/26")
    assert second[0] == ip("10.0.0.65") and ip("10.0.0.64") not in second
    assert p.gateway_for(ip("10.0.0.70")) == ip("10.0.0.64")
    assert len(drain(p, "10.0.0.192/26")) == 62  # no gateway, no broadcast
    assert pool().gateway_for(ip("10.0.0.9")) is None  # gateway "none"


def test_gateway_first_skips_excluded_addresses():
    p = pool(gateway="first", block_size=26, exclusions=["10.0.0.64-10.0.0.66"])
    assert p.gateway_for(ip("10.0.0.80")) == ip("10.0.0.67")
    assert drain(p, "10.0.0.64/26")[0] == ip("10.0.0.68")


def test_order_own_then_claim_then_borrow():
    p = pool(cidr="10.0.0.0/25", block_size=26)
    mine = {"10.0.0.0/26": block(p, "10.0.0.0/26", "n1", ["10.0.0.1"])}
    got = choose_address([p], StaticView({"p": mine}, {"p": {"10.0.0.0/26"}}), "n1", 0)
    assert (got.kind, str(got.address)) == (OWN, "10.0.0.2")
    mine = {"10.0.0.0/26": full(p, "10.0.0.0/26", "n1")}
    got = choose_address([p], StaticView({"p": mine}, {"p": {"10.0.0.0/26"}}), "n1", 0)
    assert (got.kind, str(got.block), got.claim) == (CLAIM, "10.0.0.64/26", True)
    theirs = {"10.0.0.64/26": block(p, "10.0.0.64/26", "n2", ["10.0.0.64"])}
    view = StaticView({"p": mine}, {"p": {"10.0.0.0/26", "10.0.0.64/26"}}, {"p": theirs})
    got = choose_address([p], view, "n1", 0)
    assert (got.kind, str(got.address)) == (BORROW, "10.0.0.65")


def test_strict_affinity_never_borrows():
    p = pool(cidr="10.0.0.0/25", block_size=26, strict_affinity=True)
    view = StaticView(
        {"p": {"10.0.0.0/26": full(p, "10.0.0.0/26", "n1")}},
        {"p": {"10.0.0.0/26", "10.0.0.64/26"}},
        {"p": {"10.0.0.64/26": block(p, "10.0.0.64/26", "n2")}},
    )
    assert choose_address([p], view, "n1", 0) is None
    assert choose_address([p], view, "n3", 0) is None  # a node without any block either


def test_disabled_pool_gives_nothing_new_and_the_next_pool_serves():
    off = pool("off", disabled=True)
    on = pool("on", cidr="10.1.0.0/24")
    got = choose_address([off, on], StaticView(), "n1", 0)
    assert got.pool is on and got.kind == CLAIM and got.address in on.cidr
    assert choose_address([off], StaticView(), "n1", 0) is None


def test_reuse_delay_keeps_released_addresses_back_while_others_are_free():
    p = pool(cidr="10.0.0.0/29", block_size=29, reuse_delay=120)  # .1 - .6
    recent = {"10.0.0.1": 1000.0, "10.0.0.2": 1010.0}
    b = block(p, "10.0.0.0/29", "n1", ["10.0.0.3"], recent)
    view = StaticView({"p": {"10.0.0.0/29": b}}, {"p": {"10.0.0.0/29"}})
    assert str(choose_address([p], view, "n1", 1050).address) == "10.0.0.4"
    b = block(p, "10.0.0.0/29", "n1", ["10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"], recent)
    view = StaticView({"p": {"10.0.0.0/29": b}}, {"p": {"10.0.0.0/29"}})
    cooling = choose_address([p], view, "n1", 1050)  # only cooling ones left: oldest first
    assert (str(cooling.address), cooling.kind) == ("10.0.0.1", OWN)
    later = choose_address([p], view, "n1", 1125)  # .1 cooled down at 1120: free again
    assert (str(later.address), later.kind) == ("10.0.0.1", OWN)


def test_a_new_block_comes_before_a_cooling_address():
    p = pool(cidr="10.0.0.0/28", block_size=29)
    b = block(p, "10.0.0.0/29", "n1", [f"10.0.0.{i}" for i in range(2, 8)], {"10.0.0.1": 100.0})
    view = StaticView({"p": {"10.0.0.0/29": b}}, {"p": {"10.0.0.0/29"}})
    assert choose_address([p], view, "n1", 110).kind == CLAIM
    view = StaticView({"p": {"10.0.0.0/29": b}}, {"p": {"10.0.0.0/29", "10.0.0.8/29"}})
    assert str(choose_address([p], view, "n1", 110).address) == "10.0.0.1"


def test_seeded_claims_differ_per_node_and_cover_every_block():
    p = pool(cidr="10.0.0.0/16", block_size=26)
    from ipam.alloc.allocator import calc_seed

    orders = {
        n: list(iter_candidate_blocks(p, set(), calc_seed(n, "p")))
        for n in ("node1", "node2", "node3")
    }
    assert len({tuple(o[:3]) for o in orders.values()}) == 3  # nodes start apart
    assert all(sorted(o) == sorted(orders["node1"]) for o in orders.values())
    assert len(orders["node1"]) == 1024 == len(set(orders["node1"]))
    again = list(itertools.islice(iter_candidate_blocks(p, set(), calc_seed("node1", "p")), 3))
    assert again == orders["node1"][:3]  # stable: a retry revisits the same order


def test_seeded_claims_are_lazy_on_an_ipv6_64():
    p = pool(cidr="fd00::/64", block_size=122)
    first = list(itertools.islice(iter_candidate_blocks(p, set(), 12345), 2))
    assert all(b.prefixlen == 122 and b.subnet_of(net("fd00::/64")) for b in first)


def test_node_selector_matching():
    assert matches({}, {"zone": "a"}) and matches("all()", {})
    assert matches({"zone": "a"}, {"zone": "a", "rack": "1"})
    assert not matches({"zone": "a"}, {"zone": "b"}) and not matches({"zone": "a"}, {})
    pools = [
        pool("b4", "10.2.0.0/24", node_selector={"zone": "a"}),
        pool("a4", "10.1.0.0/24"),
        pool("z6", "fd00::/64", node_selector={"zone": "a"}),
        pool("off4", "10.3.0.0/24", disabled=True),
        pool("other4", "10.4.0.0/24", node_selector={"zone": "b"}),
    ]
    sets = select_by_labels(pools, {"zone": "a"}, "n1")
    assert [[p.name for p in s] for s in sets] == [["a4", "b4"], ["z6"]]
    with pytest.raises(AddressExhausted, match="no IP pool selects node n9") as info:
        select_by_labels(pools[3:4], {"zone": "q"}, "n9")
    assert "zone=q" in info.value.details


def test_pools_by_name_group_per_family_in_the_given_order():
    found = {
        p.name: p
        for p in (pool("v6", "fd00::/64"), pool("x4", "10.1.0.0/24"), pool("y4", "10.2.0.0/24"))
    }
    sets = select_by_name(("v6", "y4", "x4"), found)
    assert [[p.name for p in s] for s in sets] == [["y4", "x4"], ["v6"]]
    with pytest.raises(InvalidConfig, match=r"ipam.pools\[1\]: no IP pool named 'nope'"):
        select_by_name(("v6", "nope"), found)


def test_static_requests_map_to_their_family_and_refuse_what_is_never_handed_out():
    sets = group_by_family(
        [
            pool("v4", "10.0.0.0/24", gateway="first", exclusions=["10.0.0.200/29"]),
            pool("v6", "fd00::/64"),
        ]
    )
    assert assign_requested(sets, [ip("fd00::9"), ip("10.0.0.9")]) == {
        0: ip("10.0.0.9"),
        1: ip("fd00::9"),
    }
    for wanted, words in (
        ("10.0.0.1", "gateway of block 10.0.0.0/26"),
        ("10.0.0.201", "excluded"),
        ("10.0.0.255", "broadcast"),
        ("10.9.0.1", "outside every pool"),
    ):
        with pytest.raises(InvalidConfig) as info:
            assign_requested(sets, [ip(wanted)])
        assert words in str(info.value)
    with pytest.raises(InvalidConfig, match="two IPv4 addresses"):
        assign_requested(sets, [ip("10.0.0.9"), ip("10.0.0.10")])

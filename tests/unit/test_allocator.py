"""The allocation policy, pure: pools, blocks, which address comes next."""

from __future__ import annotations

import ipaddress
import itertools

from ipam.alloc.allocator import (
    Pool,
    Range,
    block_capacity,
    block_containing,
    calc_block_prefix,
    calc_pool_name,
    calc_pools,
    find_pool,
    iter_candidate_blocks,
    pick_address,
)
from ipam.alloc.policy import StaticView
from ipam.alloc.policy import choose_address as choose
from ipam.records import BlockRecord

ip = ipaddress.ip_address
net = ipaddress.ip_network


def rng(
    subnet: str,
    start: str | None = None,
    end: str | None = None,
    gateway: str | None = None,
    block: int | None = None,
) -> Range:
    s = net(subnet)
    last = s.broadcast_address - (1 if s.version == 4 else 0)
    return Range(
        s,
        ip(start) if start else s.network_address + 1,
        ip(end) if end else last,
        ip(gateway) if gateway else s.network_address + 1,
        block,
        "test",
    )


def pool_of(*ranges: Range, network: str = "net"):
    (pool,) = calc_pools(network, ranges)
    return pool


def drain(pool, block) -> list[str]:
    """Every address of a block in allocation order."""
    allocations: dict[str, str] = {}
    last = None
    while (addr := pick_address(pool, block, allocations, last)) is not None:
        allocations[str(addr)] = "h"
        last = str(addr)
    return list(allocations)


def test_pool_name_is_network_and_subnet():
    assert calc_pool_name("podnet", net("10.22.0.0/16")) == "podnet-10.22.0.0-16"
    assert calc_pool_name("podnet", net("fd00::/64")) == "podnet-fd00::-64"


def test_block_prefix_defaults_and_never_exceeds_the_subnet():
    assert calc_block_prefix(net("10.0.0.0/16")) == 26
    assert calc_block_prefix(net("fd00::/64")) == 122
    assert calc_block_prefix(net("10.0.0.0/28")) == 28
    assert calc_block_prefix(net("10.0.0.0/16"), 24) == 24
    assert calc_block_prefix(net("10.0.0.0/24"), 16) == 24
    assert (
        calc_block_prefix(net("fd00::/120")) == 122 and calc_block_prefix(net("fd00::/124")) == 124
    )


def test_gateway_network_and_broadcast_are_never_handed_out():
    pool = pool_of(rng("10.0.0.0/28"))
    got = drain(pool, net("10.0.0.0/28"))
    assert got == [f"10.0.0.{i}" for i in range(2, 15)]
    assert block_capacity(pool, net("10.0.0.0/28")) == 13


def test_explicit_gateway_in_the_middle_is_skipped():
    pool = pool_of(rng("10.0.0.0/29", gateway="10.0.0.4"))
    assert drain(pool, net("10.0.0.0/29")) == [
        "10.0.0.1",
        "10.0.0.2",
        "10.0.0.3",
        "10.0.0.5",
        "10.0.0.6",
    ]


def test_range_start_and_end_limit_the_addresses():
    pool = pool_of(rng("10.0.0.0/24", start="10.0.0.100", end="10.0.0.103"))
    blocks = list(iter_candidate_blocks(pool, set()))
    assert blocks == [net("10.0.0.64/26")]
    assert drain(pool, blocks[0]) == ["10.0.0.100", "10.0.0.101", "10.0.0.102", "10.0.0.103"]
    assert not pool.allocatable(ip("10.0.0.99")) and not pool.allocatable(ip("10.0.0.104"))


def test_range_end_at_broadcast_still_excludes_broadcast():
    pool = pool_of(rng("10.0.0.0/30", start="10.0.0.0", end="10.0.0.3", gateway="10.0.0.1"))
    assert drain(pool, net("10.0.0.0/30")) == ["10.0.0.2"]


def test_round_robin_resumes_after_last_and_wraps():
    pool = pool_of(rng("10.0.0.0/28"))
    block = net("10.0.0.0/28")
    assert str(pick_address(pool, block, {"10.0.0.2": "a"}, "10.0.0.5")) == "10.0.0.6"
    assert str(pick_address(pool, block, {}, "10.0.0.14")) == "10.0.0.2"
    held = {f"10.0.0.{i}": "h" for i in range(3, 15)}
    assert str(pick_address(pool, block, held, "10.0.0.9")) == "10.0.0.2"


def test_full_block_gives_none():
    pool = pool_of(rng("10.0.0.0/28"))
    held = {f"10.0.0.{i}": "h" for i in range(2, 15)}
    assert pick_address(pool, net("10.0.0.0/28"), held, "10.0.0.14") is None


def test_candidate_blocks_skip_taken_lowest_first():
    pool = pool_of(rng("10.0.0.0/24"))
    got = list(iter_candidate_blocks(pool, {"10.0.0.0/26", "10.0.0.128/26"}))
    assert got == [net("10.0.0.64/26"), net("10.0.0.192/26")]


def test_candidate_blocks_are_lazy_over_an_ipv6_64():
    pool = pool_of(rng("fd00::/64"))
    first = list(itertools.islice(iter_candidate_blocks(pool, {"fd00::/122"}), 2))
    assert first == [net("fd00::40/122"), net("fd00::80/122")]


def test_ipv6_uses_full_128_bit_arithmetic():
    pool = pool_of(rng("fd00:1:2:3::/64", start="fd00:1:2:3:ffff:ffff:ffff:fff0"))
    (block,) = itertools.islice(iter_candidate_blocks(pool, set()), 1)
    assert block == net("fd00:1:2:3:ffff:ffff:ffff:ffc0/122")
    got = drain(pool, block)
    assert got[0] == "fd00:1:2:3:ffff:ffff:ffff:fff0"
    assert got[-1] == "fd00:1:2:3:ffff:ffff:ffff:ffff"  # no broadcast in IPv6
    assert len(got) == 16


def test_ipv6_subnet_address_and_gateway_skipped():
    pool = pool_of(rng("fd00::/122"))
    got = drain(pool, net("fd00::/122"))
    assert got[0] == "fd00::2" and "fd00::" not in got and "fd00::1" not in got
    assert len(got) == 62


def test_block_containing_an_address():
    pool = pool_of(rng("10.1.0.0/16"))
    assert block_containing(pool, ip("10.1.3.77")) == net("10.1.3.64/26")


def test_same_subnet_ranges_merge_into_one_pool():
    pools = calc_pools(
        "net",
        (
            rng("10.0.0.0/24", end="10.0.0.10"),
            rng("10.0.0.0/24", start="10.0.0.200", gateway="10.0.0.1"),
            rng("10.9.0.0/24"),
        ),
    )
    assert [p.name for p in pools] == ["net-10.0.0.0-24", "net-10.9.0.0-24"]
    assert pools[0].allocatable(ip("10.0.0.5")) and pools[0].allocatable(ip("10.0.0.201"))
    assert not pools[0].allocatable(ip("10.0.0.100"))
    blocks = list(iter_candidate_blocks(pools[0], set()))
    assert blocks == [net("10.0.0.0/26"), net("10.0.0.192/26")]


def own(pool, *blocks: tuple[str, dict[str, str]]) -> dict:
    return {
        pool.name: {cidr: BlockRecord(pool.name, cidr, "n1", allocs) for cidr, allocs in blocks}
    }


def choose_address(pools, own_blocks, taken):
    return choose(pools, StaticView(own_blocks, taken), "n1", 0.0)


def test_choose_prefers_own_block_with_room():
    pool = pool_of(rng("10.0.0.0/24"))
    choice = choose_address(
        (pool,),
        own(pool, ("10.0.0.64/26", {"10.0.0.64": "a"})),
        {pool.name: {"10.0.0.0/26", "10.0.0.64/26"}},
    )
    assert (str(choice.block), str(choice.address), choice.claim) == (
        "10.0.0.64/26",
        "10.0.0.65",
        False,
    )


def test_choose_claims_next_free_block_when_own_are_full():
    pool = pool_of(rng("10.0.0.0/28", block=30))
    full = {"10.0.0.0/30": {"10.0.0.2": "a", "10.0.0.3": "b"}}
    choice = choose_address((pool,), own(pool, *full.items()), {pool.name: {"10.0.0.0/30"}})
    assert (str(choice.block), str(choice.address), choice.claim) == (
        "10.0.0.4/30",
        "10.0.0.4",
        True,
    )


def test_choose_moves_to_the_next_range_of_the_set_when_the_first_is_exhausted():
    first = pool_of(rng("10.0.0.0/30"))  # one usable address: .2
    second = pool_of(rng("10.5.0.0/24"))
    taken = {first.name: {"10.0.0.0/30"}, second.name: set()}
    choice = choose_address((first, second), own(first, ("10.0.0.0/30", {"10.0.0.2": "a"})), taken)
    assert choice.pool is second and str(choice.address) == "10.5.0.2"


def test_choose_returns_none_when_every_block_is_taken_or_full():
    pool = pool_of(rng("10.0.0.0/26"))
    held = {f"10.0.0.{i}": "h" for i in range(2, 63)}
    assert (
        choose_address((pool,), own(pool, ("10.0.0.0/26", held)), {pool.name: {"10.0.0.0/26"}})
        is None
    )
    assert choose_address((pool,), {}, {pool.name: {"10.0.0.0/26"}}) is None  # another node's


def test_disabled_pool_is_skipped():
    from dataclasses import replace

    plain = pool_of(rng("10.0.0.0/24"))
    pool = Pool(replace(plain.spec, disabled=True), True, plain.ranges)
    assert choose_address((pool,), {}, {}) is None


def test_find_pool_for_a_requested_address():
    pools = calc_pools("net", (rng("10.0.0.0/24", end="10.0.0.50"), rng("10.1.0.0/24")))
    assert find_pool(pools, ip("10.1.0.9")).name == "net-10.1.0.0-24"
    assert find_pool(pools, ip("10.0.0.60")) is None
    assert find_pool(pools, ip("10.0.0.1")) is None  # gateway
    assert find_pool(pools, ip("10.1.0.255")) is None  # broadcast

"""Which address a node gets next, pure: the order of preference over blocks and pools.

For one family's pools (in order; disabled pools give nothing new):

1. a free address of one of this node's own blocks;
2. a new block claimed from the pool (netconf pools lowest first, cluster pools in an order
   seeded by the node name);
3. borrowing: a free address in another node's block, unless the pool is ``strictAffinity``;
4. an address of an own block still in its reuse delay (the one released longest ago);
5. the same in another node's block (not for ``strictAffinity`` pools).

So an address in its reuse delay is handed out only when nothing else is free. The blocks
come from a ``BlockView``, which may read the store lazily: the claimed-block list only
when step 2 is reached, other nodes' blocks only when step 3 is.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ipam.alloc.allocator import (
    IPAddr,
    Pool,
    calc_seed,
    cidr_order,
    iter_candidate_blocks,
    parse_cidr,
    pick_address,
)
from ipam.records import BlockRecord, IPNet

OWN, CLAIM, BORROW = "own", "claim", "borrow"


@dataclass(frozen=True)
class Choice:
    """Where one address comes from: an own block, a block to claim, or a borrowed one."""

    pool: Pool
    block: IPNet
    address: IPAddr
    kind: str = OWN

    @property
    def claim(self) -> bool:
        return self.kind == CLAIM


class BlockView(Protocol):
    def own(self, pool: Pool) -> Mapping[str, BlockRecord]:
        """This node's blocks of ``pool`` by CIDR."""

    def taken(self, pool: Pool) -> Collection[str]:
        """The CIDR of every claimed block of ``pool`` (this node's included)."""

    def others(self, pool: Pool) -> Mapping[str, BlockRecord]:
        """Other nodes' blocks of ``pool`` by CIDR."""


@dataclass
class StaticView:
    """A ``BlockView`` over plain dicts keyed by pool name (tests, reports)."""

    own_blocks: Mapping[str, Mapping[str, BlockRecord]] = field(default_factory=dict)
    taken_blocks: Mapping[str, Collection[str]] = field(default_factory=dict)
    other_blocks: Mapping[str, Mapping[str, BlockRecord]] = field(default_factory=dict)

    def own(self, pool: Pool) -> Mapping[str, BlockRecord]:
        return self.own_blocks.get(pool.name, {})

    def taken(self, pool: Pool) -> Collection[str]:
        return self.taken_blocks.get(pool.name, ())

    def others(self, pool: Pool) -> Mapping[str, BlockRecord]:
        return self.other_blocks.get(pool.name, {})


def choose_address(pools: Iterable[Pool], view: BlockView, node: str, now: float) -> Choice | None:
    """The address ``node`` gets from ``pools`` (one family, in order); None: none left."""
    active = [p for p in pools if not p.disabled]
    lenient = [p for p in active if not p.strict_affinity]
    return (
        pick_fresh(active, view.own, now, OWN)
        or pick_claim(active, view, node)
        or pick_fresh(lenient, lambda p: ordered_for(node, view.others(p)), now, BORROW)
        or pick_cooling(active, view.own, now, OWN)
        or pick_cooling(lenient, view.others, now, BORROW)
    )


Blocks = Callable[[Pool], Mapping[str, BlockRecord]]


def pick_fresh(pools: list[Pool], blocks: Blocks, now: float, kind: str) -> Choice | None:
    for pool in pools:
        for cidr, block in sorted_blocks(blocks(pool), kind == OWN):
            if len(block.allocations) >= pool.capacity(cidr):  # full: the common case
                continue
            cooling = block.cooling(now, pool.reuse_delay) if block.released else set()
            if len(block.allocations) + len(cooling) >= pool.capacity(cidr):
                continue  # nothing but cooling addresses left: no need to walk the block
            ip = pick_address(pool, cidr, block.allocations, block.last, cooling)
            if ip is not None:
                return Choice(pool, parse_cidr(cidr), ip, kind)
    return None


def pick_claim(pools: list[Pool], view: BlockView, node: str) -> Choice | None:
    for pool in pools:
        block = next(
            iter_candidate_blocks(pool, view.taken(pool), calc_seed(node, pool.name)), None
        )
        if block is not None:
            ip = pick_address(pool, block)
            assert ip is not None  # a candidate block has capacity: its first address is free
            return Choice(pool, block, ip, CLAIM)
    return None


def pick_cooling(pools: list[Pool], blocks: Blocks, now: float, kind: str) -> Choice | None:
    """The free address released longest ago, in the first block that has one."""
    for pool in pools:
        for cidr, block in sorted_blocks(blocks(pool), True):
            net = parse_cidr(cidr)
            waiting = [
                (t, a)
                for a, t in block.released.items()
                if a not in block.allocations and pool.allocatable(_ip(a))
            ]
            if waiting:
                return Choice(pool, net, _ip(min(waiting)[1]), kind)
    return None


def sorted_blocks(
    blocks: Mapping[str, BlockRecord], by_address: bool
) -> list[tuple[str, BlockRecord]]:
    items = list(blocks.items())
    return sorted(items, key=lambda item: cidr_order(item[0])) if by_address else items


def ordered_for(node: str, blocks: Mapping[str, BlockRecord]) -> dict[str, BlockRecord]:
    """Other nodes' blocks in an order of this node's own, so borrowers spread out."""
    return dict(sorted(blocks.items(), key=lambda item: calc_seed(node, item[0])))


def _ip(text: str) -> IPAddr:
    return ipaddress.ip_address(text)

"""Utilisation of pools and blocks, counted from their records (pure, no I/O).

The one place utilisation is counted (capacity, used, cooling, borrowed, free): ``pycni ipam
show`` (``ipam.ops.show``) and the per-pool metrics of pycnid (``ipam.leases.metrics``) count the
same way. It sits below both, over the record types of ``ipam.records``, so neither the daemon
nor ``cni/`` imports the operator tools to count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ipam.alloc.pool_spec import PoolSpec
from ipam.records import BlockRecord


class Holder(Protocol):
    """What counting needs of a handle: the node it was allocated for."""

    @property
    def node(self) -> str: ...


@dataclass(frozen=True)
class Usage:
    capacity: int  # addresses that can ever be handed out
    used: int
    cooling: int  # released, within the pool's reuse delay
    borrowed: int  # held by a handle of a node other than the block's

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.used - self.cooling)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.capacity + other.capacity,
            self.used + other.used,
            self.cooling + other.cooling,
            self.borrowed + other.borrowed,
        )

    def to_dict(self) -> dict:
        return {
            "capacity": self.capacity,
            "used": self.used,
            "free": self.free,
            "cooling": self.cooling,
            "borrowed": self.borrowed,
        }


def is_cooling(block: BlockRecord, ip: str, reuse_delay: float, now: float) -> bool:
    released = block.released.get(ip)
    return ip not in block.allocations and released is not None and now < released + reuse_delay


def is_borrowed(block: BlockRecord, ip: str, handle: Holder | None) -> bool:
    """An address the block marks borrowed, or held by a handle of another node."""
    if ip in block.borrowed:
        return True
    if handle is None:  # (a handle's borrowedFrom attribute names no address: not used)
        return False
    return bool(handle.node and block.affinity and handle.node != block.affinity)


def calc_block_usage(
    spec: PoolSpec, block: BlockRecord, handles: Mapping[str, Holder], now: float
) -> Usage:
    return Usage(
        spec.block_capacity(block.net),
        len(block.allocations),
        sum(1 for ip in block.released if is_cooling(block, ip, spec.reuse_delay, now)),
        sum(1 for ip, h in block.allocations.items() if is_borrowed(block, ip, handles.get(h))),
    )


def calc_pool_usage(
    spec: PoolSpec, blocks: Iterable[BlockRecord], handles: Mapping[str, Holder], now: float
) -> Usage:
    """The whole pool: capacity is ``spec.size`` (claimed blocks or not)."""
    total = Usage(0, 0, 0, 0)
    for block in blocks:
        total = total + calc_block_usage(spec, block, handles, now)
    return Usage(spec.size, total.used, total.cooling, total.borrowed)

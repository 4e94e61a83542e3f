"""Sets of addresses as sorted, disjoint, inclusive integer intervals (pure).

Pool sizes are counted on intervals, never by enumerating addresses: an IPv6 /64 pool holds
2**64 addresses and 2**58 blocks of /122.
"""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[int, int]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint, non-adjacent intervals covering the same addresses."""
    out: list[Interval] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def intersect(intervals: list[Interval], bounds: Interval) -> list[Interval]:
    lo, hi = bounds
    return [(max(a, lo), min(b, hi)) for a, b in intervals if a <= hi and b >= lo]


def subtract(intervals: list[Interval], holes: list[Interval]) -> list[Interval]:
    """``intervals`` minus ``holes`` (both merged)."""
    out: list[Interval] = []
    for lo, hi in intervals:
        start = lo
        for a, b in holes:
            if b < start or a > hi:
                continue
            if a > start:
                out.append((start, a - 1))
            start = max(start, b + 1)
            if start > hi:
                break
        if start <= hi:
            out.append((start, hi))
    return out


def count(intervals: Iterable[Interval]) -> int:
    return sum(hi - lo + 1 for lo, hi in intervals)


def fully_covered_blocks(intervals: list[Interval], block_size: int, max_prefixlen: int) -> int:
    """How many aligned blocks of prefix ``block_size`` lie entirely inside the (merged)
    ``intervals``."""
    step = 1 << (max_prefixlen - block_size)
    return sum(max(0, (hi + 1) // step - (lo + step - 1) // step) for lo, hi in intervals)

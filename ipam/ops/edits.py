"""Edits the operator tools make to stored records (pure), on the record types of ``ipam.records``.

The operator tools (release, gc, pool rm --force) rewrite records the allocator wrote. They
edit the same ``BlockRecord`` / ``HandleRecord`` the daemon does; a field they do not know
(added by a newer pycnid) is carried in the record's ``extra`` and written back. A freed
address is stamped in the block's ``released`` map (its reuse delay: it is handed out again
within ``reuseDelay`` only when nothing else is free) and a block left without allocations gets
``emptySince``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from ipam.records import BlockRecord, HandleRecord


def block_without(block: BlockRecord, ips: Iterable[str], now: float) -> BlockRecord:
    """``ips`` freed; those that were allocated start their reuse delay at ``now``."""
    for ip in ips:
        block = block.without(ip, released_at=now if ip in block.allocations else None)
    return block


def block_with(block: BlockRecord, ip: str, holder: str, node: str = "") -> BlockRecord:
    """``ip`` allocated to ``holder``; marked borrowed when ``node`` is not the block's."""
    return block.with_allocation(ip, holder, advance=False, borrower=node or None)


def handle_without(handle: HandleRecord, ip: str, pool: str | None = None) -> HandleRecord:
    """The handle without ``ip`` (only the entry of ``pool`` when given)."""
    return replace(
        handle,
        ips=tuple(
            item
            for item in handle.ips
            if not (item.ip == ip and (pool is None or item.pool == pool))
        ),
    )


def block_at(key: str, data: Mapping[str, Any] | None) -> BlockRecord | None:
    """The block record of a decoded value (None: absent); unusable raises CorruptRecord."""
    return None if data is None else BlockRecord.from_dict(key, data)


def handle_at(key: str, data: Mapping[str, Any] | None) -> HandleRecord | None:
    return None if data is None else HandleRecord.from_dict(key, data)


def lists(handle: HandleRecord | None, ip: str, block_key: str) -> bool:
    """Whether the handle record lists ``ip`` in the block at ``block_key``."""
    return any(
        item.ip == ip and item.block_key == block_key for item in (handle.ips if handle else ())
    )

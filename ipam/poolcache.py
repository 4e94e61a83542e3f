"""What a node remembers of the store between requests: per pool, its record and blocks.

An optimistic cache: every txn built from it compares the ``mod_revision`` of each key it
read, so a stale entry can only make a txn fail, never hand out an address twice. After a
failed txn the lease service re-reads the compared keys (``refresh``) and plans again.
Not thread-safe on its own: the lease service holds its lock around every use.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ipam.allocator import Pool, apply_pool_record
from ipam.records import (BLOCKS, POOLS, BlockRecord, block_key, blocks_prefix, decode,
                          parse_cidr_key, pool_key)
from ipam.store.base import KV, Store


@dataclass
class PoolState:
    config: Pool  # as the netconf derives it
    pool: Pool  # effective: the stored block size and `disabled` applied
    record: dict | None = None  # /pycni/v1/pools/<pool> as stored (None: absent)
    record_rev: int = 0
    own: dict[str, tuple[int, BlockRecord]] = field(default_factory=dict)  # cidr -> (rev, block)
    taken: set[str] = field(default_factory=set)  # every claimed block's CIDR, ours included

    def own_blocks(self) -> dict[str, BlockRecord]:
        return {cidr: block for cidr, (_, block) in self.own.items()}

    def set_record(self, record: dict | None, revision: int) -> None:
        self.record, self.record_rev = record, revision
        self.pool = apply_pool_record(self.config, record) if record else self.config

    def set_block(self, node: str, cidr: str, revision: int, block: BlockRecord | None) -> None:
        """Remember one block as the store has it now (None: the key is absent)."""
        self.own.pop(cidr, None)
        self.taken.discard(cidr)
        if block is None:
            return
        self.taken.add(cidr)
        if block.affinity == node:
            self.own[cidr] = (revision, block)


class PoolCache:
    def __init__(self, store: Store, node: str) -> None:
        self.store = store
        self.node = node
        self.pools: dict[str, PoolState] = {}

    def state(self, config: Pool, fresh: bool = False) -> PoolState:
        """The pool's state, loaded from the store on first use (or when ``fresh``)."""
        state = self.pools.get(config.name)
        if state is None or fresh:
            state = self.load(config)
            self.pools[config.name] = state
        elif state.config != config:  # the netconf's range limits changed
            state.config = config
            state.set_record(state.record, state.record_rev)
        return state

    def load(self, config: Pool) -> PoolState:
        state = PoolState(config=config, pool=config)
        kv = self.store.get(pool_key(config.name))
        if kv is not None:
            state.set_record(decode(kv.key, kv.value), kv.mod_revision)
        for kv in self.store.range(blocks_prefix(config.name)):
            block = BlockRecord.from_bytes(kv.key, kv.value)
            state.set_block(self.node, block.cidr, kv.mod_revision, block)
        return state

    def cached_block(self, pool: str, cidr: str) -> tuple[int, BlockRecord] | None:
        state = self.pools.get(pool)
        return state.own.get(cidr) if state else None

    def read_block(self, pool: str, cidr: str) -> tuple[int, BlockRecord | None]:
        """A block as the cache has it if it is ours, else as the store has it now."""
        cached = self.cached_block(pool, cidr)
        if cached is not None:
            return cached
        kv = self.store.get(block_key(pool, cidr))
        return (kv.mod_revision, BlockRecord.from_bytes(kv.key, kv.value)) if kv else (0, None)

    def note_block(self, pool: str, cidr: str, revision: int, block: BlockRecord | None) -> None:
        state = self.pools.get(pool)
        if state is not None:
            state.set_block(self.node, cidr, revision, block)

    def note_pool(self, pool: str, revision: int, record: dict | None) -> None:
        state = self.pools.get(pool)
        if state is not None:
            state.set_record(record, revision)

    def refresh(self, key: str, kv: KV | None) -> None:
        """Update from a key just re-read after a failed txn (pool or block keys)."""
        if key.startswith(POOLS):
            name = key[len(POOLS):]
            self.note_pool(name, kv.mod_revision if kv else 0,
                           decode(kv.key, kv.value) if kv else None)
        elif key.startswith(BLOCKS):
            pool, _, cidr_text = key[len(BLOCKS):].rpartition("/")
            block = BlockRecord.from_bytes(kv.key, kv.value) if kv else None
            self.note_block(pool, str(parse_cidr_key(cidr_text)), kv.mod_revision if kv else 0,
                            block)


def describe_blocks(state: PoolState) -> str:
    """For exhaustion messages: how the pool's blocks are spread."""
    others = len(state.taken) - len(state.own)
    return (f"pool {state.pool.name}: {len(state.own)} block(s) of this node full, "
            f"{others} claimed by other nodes" + (", pool disabled" if state.pool.disabled else ""))


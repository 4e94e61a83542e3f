"""What a plan sees: its own pending writes first, then the pool cache, then the store.

``PlanView`` is the allocation policy's ``BlockView`` of a plan; ``PlanReads`` (which
``Planner`` extends) reads one block or handle the same way before writing it, so the txn
compares the revision the plan was made from.
"""

from __future__ import annotations

from collections.abc import Iterable

from ipam.alloc.allocator import Pool
from ipam.alloc.plan import Plan
from ipam.alloc.pool_cache import PoolCache, PoolState
from ipam.records import BlockRecord, HandleId, HandleRecord
from store.keys import HANDLES, block_key


class PlanReads:
    """Reads for a plan of ``node``: through ``cache``, which learns what the store says."""

    def __init__(self, cache: PoolCache, node: str) -> None:
        self.cache, self.node = cache, node

    def existing_handle(self, plan: Plan, handle: HandleId) -> HandleRecord | None:
        """The lease ``handle`` holds: pending in this plan, or in the store when the cache
        has seen it (the cache alone never answers: the txn's compare decides)."""
        key = handle.key
        if key in plan.handles:
            return plan.handles[key]
        known = self.cache.handles.get(key)
        if known is None or known[1] is None:
            return None
        kv = self.cache.store.get(key)
        record = HandleRecord.from_bytes(kv.key, kv.value) if kv else None
        self.cache.note_handle(key, kv.mod_revision if kv else 0, record)
        if record is not None:
            self.cache.in_doubt.pop(key, None)  # an ADD answered with it: it is in use now
        return record

    def block_for_write(self, plan: Plan, pool: str, cidr: str) -> tuple[int, BlockRecord | None]:
        """A block as this plan, the cache or (not cached) the store has it: (revision, block)."""
        key = block_key(pool, cidr)
        written, pending = plan.pending_block(key)
        if written:
            return plan.compares[key], pending
        state = self.cache.states.get(pool)
        if state is not None and cidr in state.own:
            return state.own[cidr]
        if state is not None and state.others is not None and cidr in state.others:
            return state.others[cidr]
        kv = self.cache.store.get(key)
        return (kv.mod_revision, BlockRecord.from_bytes(kv.key, kv.value)) if kv else (0, None)

    def reread_block(self, pool: str, cidr: str) -> BlockRecord | None:
        """A block as the store has it now (the cache learns it too)."""
        kv = self.cache.store.get(block_key(pool, cidr))
        block = BlockRecord.from_bytes(kv.key, kv.value) if kv else None
        self.cache.note_block(pool, cidr, kv.mod_revision if kv else 0, block)
        return block

    def describe_holder(self, holder: str) -> str:
        """Who holds an address: the handle, and its pod and node when the handle says."""
        kv = self.cache.store.get(HANDLES + holder)
        attrs = HandleRecord.from_bytes(kv.key, kv.value).attributes if kv else {}
        pod = "/".join(attrs[k] for k in ("namespace", "pod") if attrs.get(k))
        where = [f"pod {pod}" if pod else "", f"node {attrs['node']}" if attrs.get("node") else ""]
        return f"release {holder} first" + (
            f" ({', '.join(w for w in where if w)})" if any(where) else ""
        )

    def current_handle(self, plan: Plan, key: str) -> tuple[int, HandleRecord | None]:
        """A handle as this plan, the cache or the store has it: (revision, record)."""
        if key in plan.handles:
            return plan.compares[key], plan.handles[key]
        known = self.cache.handles.get(key)
        if known is not None and known[1] is not None:
            return known
        kv = self.cache.store.get(key)
        record = HandleRecord.from_bytes(kv.key, kv.value) if kv else None
        return (kv.mod_revision if kv else 0), record


class PlanView:
    """The policy's ``BlockView``: the cache with this plan's pending block writes on top."""

    def __init__(self, reads: PlanReads, plan: Plan, states: Iterable[PoolState]) -> None:
        self.reads, self.plan = reads, plan
        self.states = {s.name: s for s in states}

    def _pending(self, pool: Pool) -> Iterable[tuple[str, BlockRecord | None]]:
        return (
            (cidr, block) for name, cidr, block in self.plan.blocks.values() if name == pool.name
        )

    def own(self, pool: Pool) -> dict[str, BlockRecord]:
        blocks = self.states[pool.name].own_blocks()
        for cidr, block in self._pending(pool):
            if block is None or block.affinity != self.reads.node:
                blocks.pop(cidr, None)
            else:
                blocks[cidr] = block
        return blocks

    def taken(self, pool: Pool) -> set[str]:
        taken = set(self.reads.cache.taken(self.states[pool.name]))
        for cidr, block in self._pending(pool):
            (taken.add if block is not None else taken.discard)(cidr)
        return taken

    def others(self, pool: Pool) -> dict[str, BlockRecord]:
        found = self.reads.cache.others(self.states[pool.name])
        blocks = {cidr: block for cidr, (_, block) in found.items()}
        for cidr, block in self._pending(pool):
            if block is None or block.affinity == self.reads.node:
                blocks.pop(cidr, None)
            else:
                blocks[cidr] = block
        return blocks

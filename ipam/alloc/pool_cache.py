"""What a node remembers of the store between requests, so an ADD is one txn round trip.

Per pool: its record, this node's blocks (found through the affinity index with one
``keys_only`` range, then one get per own block), and lazily the CIDRs of every claimed block
(``keys_only``: only when claiming) and other nodes' blocks (values: only when borrowing).
Also the list of pool records and the handles this node wrote. The pool records are re-read
when another writer may have changed them: ``changes`` is a counter that moves when another
writer committed (SQLite's ``data_version``: the CLI's ``pycni ipam pool set`` is seen by the
next ADD, while this node's own ADDs never force a re-read); without one (etcd) the list is
kept current by the pool watch (``ipam.leases.pool_watch``), and the planner re-reads it before
any refusal. An optimistic cache: every txn built from it compares the ``mod_revision`` of
each key it read, so a stale entry can only make a txn fail, never hand out an address twice;
after a failed txn the compared keys are re-read (``refresh``). Not thread-safe on its own:
the lease service runs every use under its lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cni.spec.errors import CNIError
from ipam.alloc.allocator import Pool, apply_pool_record, pool_from_record
from ipam.records import BlockRecord, HandleRecord
from store.base import KV, Store
from store.codec import decode
from store.keys import (
    AFFINITY,
    BLOCKS,
    HANDLES,
    POOLS,
    affinity_prefix,
    block_key,
    blocks_prefix,
    parse_block_key,
    pool_key,
)

log = logging.getLogger("pycnid.ipam")
OTHERS_TTL = 1.0
HANDLE_CACHE_LIMIT = 65536


@dataclass
class PoolState:
    pool: Pool  # effective: the stored record applied
    base: Pool | None = None  # netconf pools: as the netconf derives it
    record: dict | None = None  # /pycni/v1/pools/<pool> as stored (None: absent)
    record_rev: int = 0
    own: dict[str, tuple[int, BlockRecord]] = field(default_factory=dict)  # cidr -> (rev, block)
    indexed: dict[str, int] = field(default_factory=dict)  # cidr -> affinity key revision
    taken: set[str] | None = None  # every claimed block's CIDR; None: not read yet
    others: dict[str, tuple[int, BlockRecord]] | None = None  # None: not read (or stale)
    others_at: float = 0.0

    @property
    def name(self) -> str:
        return self.pool.name

    def own_blocks(self) -> dict[str, BlockRecord]:
        return {cidr: block for cidr, (_, block) in self.own.items()}

    def set_record(self, record: dict | None, revision: int) -> None:
        self.record, self.record_rev = record, revision
        if self.base is not None:
            self.pool = apply_pool_record(self.base, record) if record else self.base
        elif record is not None:
            self.pool = pool_from_record(record)

    def set_block(self, node: str, cidr: str, revision: int, block: BlockRecord | None) -> None:
        """Remember one block as the store has it now (None: the key is absent)."""
        self.own.pop(cidr, None)
        if self.others is not None:
            self.others.pop(cidr, None)
        if self.taken is not None:
            self.taken.discard(cidr)
        if block is None:
            return
        if self.taken is not None:
            self.taken.add(cidr)
        if block.affinity == node:
            self.own[cidr] = (revision, block)
        elif self.others is not None:
            self.others[cidr] = (revision, block)


class PoolCache:
    def __init__(
        self,
        store: Store,
        node: str,
        *,
        changes: Callable[[], int] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.node = node
        self.changes = changes
        self.monotonic = monotonic
        self.states: dict[str, PoolState] = {}
        self.handles: dict[str, tuple[int, HandleRecord | None]] = {}
        self.records: dict[str, tuple[int, dict]] = {}  # cluster pool records by name
        self.bad_records: dict[str, CNIError] = {}
        # handle key -> (values a txn whose outcome is unknown may have written, since when)
        self.in_doubt: dict[str, tuple[set[bytes], float]] = {}
        self._pools: dict[str, tuple[int, Pool]] = {}
        self._seen: int | None = None  # ``changes()`` when the records were read (None: never)

    def sync(self) -> None:
        """Re-read the pool records when another writer committed since they were read."""
        if self.changes is not None and self._seen is not None and self.changes() != self._seen:
            self._read_records()

    # -- pools -----------------------------------------------------------------------------
    def netconf_state(self, base: Pool, fresh: bool = False) -> PoolState:
        """A netconf pool's state, loaded on first use (or when ``fresh``)."""
        state = self.states.get(base.name)
        if state is None or fresh:
            state = PoolState(pool=base, base=base)
            self._load(state)
        elif state.base is not base:  # the netconf's ranges may have changed
            state.base = base
            state.set_record(state.record, state.record_rev)
        return state

    def cluster_pools(self, fresh: bool = False) -> dict[str, Pool]:
        """Every cluster pool as stored (read on first use, when ``fresh``, and by ``sync``)."""
        if fresh or self._seen is None:
            self._read_records()
        return {name: self._pool_of(name) for name in self.records}

    def _pool_of(self, name: str) -> Pool:
        state = self.states.get(name)
        if state is not None:
            return state.pool
        revision, record = self.records[name]
        memo = self._pools.get(name)
        if memo is None or memo[0] != revision:
            memo = self._pools[name] = (revision, pool_from_record(record))
        return memo[1]

    def cluster_state(self, name: str, fresh: bool = False) -> PoolState:
        """A listed cluster pool's state, loaded on first use (or when ``fresh``)."""
        state = self.states.get(name)
        if state is None or fresh:
            revision, record = self.records[name]
            state = PoolState(
                pool=self._pool_of(name) if not fresh else pool_from_record(record),
                record=record,
                record_rev=revision,
            )
            self._load(state)
        return state

    def _read_records(self) -> None:
        """Every pool record (one range): the cluster pools' list, and the records of the
        pools already loaded (a netconf pool's too: ``pool set`` may change it)."""
        self._seen = self.changes() if self.changes is not None else 0
        stored: dict[str, tuple[int, dict]] = {}
        self.bad_records = {}
        for kv in self.store.range(POOLS):
            name = kv.key[len(POOLS) :]
            try:
                stored[name] = (kv.mod_revision, decode(kv.key, kv.value))
                if stored[name][1].get("source") != "netconf":
                    pool_from_record(stored[name][1])
            except CNIError as err:
                log.warning("ignoring IPAM pool %s: %s", name, err)
                self.bad_records[name] = err
        self.records = {
            name: found
            for name, found in stored.items()
            if name not in self.bad_records and found[1].get("source") != "netconf"
        }
        self._update_states(stored)

    def _update_states(self, stored: dict[str, tuple[int, dict]]) -> None:
        for name, state in list(self.states.items()):
            revision, record = stored.get(name, (0, None))
            if state.base is None and name not in self.records:
                del self.states[name]
            elif revision != state.record_rev and name not in self.bad_records:
                state.set_record(record, revision)

    def _load(self, state: PoolState) -> None:
        """Read the pool record (netconf pools) and this node's blocks."""
        if state.base is not None:
            kv = self.store.get(pool_key(state.name))
            state.set_record(
                decode(kv.key, kv.value) if kv else None, kv.mod_revision if kv else 0
            )
        for kv in self.store.range(affinity_prefix(self.node, state.name), keys_only=True):
            _, cidr = parse_block_key(kv.key)
            found = self.store.get(block_key(state.name, cidr))
            block = BlockRecord.from_bytes(found.key, found.value) if found else None
            state.indexed[cidr] = kv.mod_revision
            if found is not None and block is not None and block.affinity == self.node:
                state.own[cidr] = (found.mod_revision, block)
        self.states[state.name] = state

    def taken(self, state: PoolState) -> set[str]:
        """Every claimed block's CIDR (read once with ``keys_only``, then kept current)."""
        if state.taken is None:
            state.taken = {
                parse_block_key(kv.key)[1]
                for kv in self.store.range(blocks_prefix(state.name), keys_only=True)
            }
        return state.taken

    def others(self, state: PoolState) -> dict[str, tuple[int, BlockRecord]]:
        """Other nodes' blocks with their values (re-read after ``OTHERS_TTL``)."""
        now = self.monotonic()
        if state.others is None or now - state.others_at > OTHERS_TTL:
            state.others, state.others_at = {}, now
            state.taken = set()
            for kv in self.store.range(blocks_prefix(state.name)):
                block = BlockRecord.from_bytes(kv.key, kv.value)
                state.set_block(self.node, block.cidr, kv.mod_revision, block)
        return state.others

    # -- what a txn teaches ----------------------------------------------------------------
    def note_block(self, pool: str, cidr: str, revision: int, block: BlockRecord | None) -> None:
        state = self.states.get(pool)
        if state is not None:
            state.set_block(self.node, cidr, revision, block)

    def note_affinity(self, pool: str, cidr: str, revision: int, present: bool) -> None:
        state = self.states.get(pool)
        if state is None:
            return
        if present:
            state.indexed[cidr] = revision
        else:
            state.indexed.pop(cidr, None)

    def note_pool(self, pool: str, revision: int, record: dict | None) -> None:
        state = self.states.get(pool)
        if state is not None and state.base is not None:  # a netconf pool
            state.set_record(record, revision)
            return
        if record is None:  # a cluster pool that is gone
            self.states.pop(pool, None)
            self.records.pop(pool, None)
            return
        if record.get("source") == "netconf":
            return
        self.records[pool] = (revision, record)
        if state is not None:
            state.set_record(record, revision)

    def note_handle(self, key: str, revision: int, record: HandleRecord | None) -> None:
        if len(self.handles) >= HANDLE_CACHE_LIMIT and key not in self.handles:
            self.handles.pop(next(iter(self.handles)))
        self.handles[key] = (revision, record)

    def forget_handle(self, key: str) -> None:
        self.handles.pop(key, None)

    def refresh(self, key: str, kv: KV | None, compared: int = -1) -> None:
        """Update from a key just re-read after a failed txn (``compared``: the revision the
        txn expected)."""
        revision = kv.mod_revision if kv else 0
        if key.startswith(POOLS):
            self.note_pool(key[len(POOLS) :], revision, decode(kv.key, kv.value) if kv else None)
        elif key.startswith(BLOCKS):
            pool, cidr = parse_block_key(key)
            self.note_block(
                pool, cidr, revision, BlockRecord.from_bytes(kv.key, kv.value) if kv else None
            )
            state = self.states.get(pool)
            if compared == 0 and kv is not None and state is not None:
                state.taken = None  # a lost claim: others claim too, re-list before the next
        elif key.startswith(AFFINITY):
            pool, cidr = parse_block_key(key)
            self.note_affinity(pool, cidr, revision, kv is not None)
        elif key.startswith(HANDLES):
            self.note_handle(
                key, revision, HandleRecord.from_bytes(kv.key, kv.value) if kv else None
            )


def describe_blocks(state: PoolState) -> str:
    """For exhaustion messages: how the pool's blocks are spread."""
    others = len(state.taken) - len(state.own) if state.taken is not None else None
    spread = f", {others} claimed by other nodes" if others is not None else ""
    flags = [
        flag
        for flag, on in (
            ("pool disabled", state.pool.disabled),
            ("strictAffinity", state.pool.strict_affinity and state.pool.source == "cluster"),
        )
        if on
    ]
    return (
        f"pool {state.pool.name}: {len(state.own)} block(s) of this node full{spread}"
        + "".join(f", {flag}" for flag in flags)
    )

"""One store txn being built: compares, writes, and what the cache learns once it commits.

Every key a plan writes is compared at the ``mod_revision`` it was read at (0: must be
absent), the first read winning, so a plan built from a stale cache can only fail, never
overwrite. A key appears in at most one op (etcd rejects a txn that names a key twice): a
later write of the same key replaces an earlier one, a delete cancels a put and vice versa.
Plans fork cheaply, so a combined txn can take one caller's part or leave it out whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ipam.records import AffinityRecord, BlockRecord, HandleRecord
from store.base import Compare, Delete, Op, Put
from store.codec import encode

MAX_TXN_OPS = 120  # etcd's default --max-txn-ops is 128


@dataclass
class Plan:
    compares: dict[str, int] = field(default_factory=dict)
    puts: dict[str, bytes] = field(default_factory=dict)
    deletes: dict[str, None] = field(default_factory=dict)
    blocks: dict[str, tuple[str, str, BlockRecord | None]] = field(default_factory=dict)
    handles: dict[str, HandleRecord | None] = field(default_factory=dict)
    affinities: dict[str, tuple[str, str, bool]] = field(default_factory=dict)
    pools: dict[str, dict] = field(default_factory=dict)
    events: list[tuple[str, str]] = field(default_factory=list)  # ("claim", pool) ... for metrics

    def fork(self) -> Plan:
        return Plan(
            dict(self.compares),
            dict(self.puts),
            dict(self.deletes),
            dict(self.blocks),
            dict(self.handles),
            dict(self.affinities),
            dict(self.pools),
            list(self.events),
        )

    def adopt(self, other: Plan) -> None:
        """Take ``other``'s contents (a fork of this plan that was planned further)."""
        self.__dict__.update(other.__dict__)

    @property
    def empty(self) -> bool:
        return not self.puts and not self.deletes

    def size(self) -> int:
        return max(len(self.compares), len(self.puts) + len(self.deletes))

    def compare(self, key: str, revision: int) -> None:
        self.compares.setdefault(key, revision)

    def put(self, key: str, revision: int, value: bytes) -> None:
        self.compare(key, revision)
        self.deletes.pop(key, None)
        self.puts[key] = value

    def delete(self, key: str, revision: int) -> None:
        self.compare(key, revision)
        self.puts.pop(key, None)
        self.deletes[key] = None

    # -- typed writes ----------------------------------------------------------------------
    def write_block(self, key: str, revision: int, pool: str, block: BlockRecord) -> None:
        self.blocks[key] = (pool, block.cidr, block)
        self.put(key, revision, block.to_bytes())

    def delete_block(self, key: str, revision: int, pool: str, cidr: str) -> None:
        self.blocks[key] = (pool, cidr, None)
        self.delete(key, revision)

    def pending_block(self, key: str) -> tuple[bool, BlockRecord | None]:
        """(written by this plan, its value) for a block key."""
        if key in self.blocks:
            return True, self.blocks[key][2]
        return False, None

    def put_handle(self, record: HandleRecord, revision: int) -> None:
        self.handles[record.handle.key] = record
        self.put(record.handle.key, revision, record.to_bytes())

    def delete_handle(self, key: str, revision: int) -> None:
        self.handles[key] = None
        self.delete(key, revision)

    def put_affinity(
        self, key: str, revision: int, pool: str, cidr: str, claimed_at: float
    ) -> None:
        self.affinities[key] = (pool, cidr, True)
        self.put(key, revision, AffinityRecord(pool, cidr, claimed_at).to_bytes())

    def delete_affinity(self, key: str, revision: int, pool: str, cidr: str) -> None:
        self.affinities[key] = (pool, cidr, False)
        self.delete(key, revision)

    def put_pool(self, key: str, revision: int, name: str, record: dict) -> None:
        self.pools[name] = record
        self.put(key, revision, encode(record))

    # -- the txn ---------------------------------------------------------------------------
    def txn_compares(self) -> list[Compare]:
        return [Compare(k, r) for k, r in self.compares.items()]

    def ops(self) -> list[Op]:
        return [*(Put(k, v) for k, v in self.puts.items()), *(Delete(k) for k in self.deletes)]

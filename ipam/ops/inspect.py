"""What the store holds, read as one snapshot (pure).

``parse_snapshot`` turns the key-values under ``/pycni/v1/`` (read in one range, so at one
revision) into the record types of ``ipam.records``, each with the key and revision it was read
at; a corrupt record becomes an entry of ``Snapshot.corrupt`` instead of an exception.
Utilisation is counted from them by ``ipam.alloc.usage`` (shared with pycnid's metrics); the
reports built on top live in ``ops.show`` (show) and ``ops.check`` (check/gc).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields

from ipam.alloc.pool_settings import PoolInvalid
from ipam.alloc.pool_spec import PoolSpec, spec_from_record
from ipam.records import BlockRecord, HandleRecord, LeasedIP
from store.base import KV
from store.codec import CorruptRecord, decode
from store.keys import AFFINITY, BLOCKS, HANDLES, HEARTBEATS, NODES, POOLS, is_buffer_handle

HandleIP = LeasedIP  # an address a handle lists


def fields_of(record: BlockRecord | HandleRecord) -> dict:
    return {f.name: getattr(record, f.name) for f in fields(record)}


@dataclass(frozen=True)
class PoolView:
    name: str
    rev: int
    record: dict
    spec: PoolSpec | None  # None: the record is unusable (``error`` says why)
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class BlockView(BlockRecord):
    """A block record as read at ``key`` (its pool and CIDR are the key's) and ``rev``."""

    key: str
    rev: int

    @classmethod
    def from_kv(cls, kv: KV) -> BlockView:
        record = BlockRecord.at_key(kv.key, kv.value)
        return cls(**fields_of(record), key=kv.key, rev=kv.mod_revision)


@dataclass(frozen=True, kw_only=True)
class HandleView(HandleRecord):
    """A handle record as read at ``key`` and ``rev``."""

    key: str
    rev: int

    @property
    def id(self) -> str:  # as block allocations name it: "network/containerID/ifname"
        return self.key[len(HANDLES) :]

    @property
    def network(self) -> str:
        return self.id.split("/", 1)[0]

    @property
    def is_buffer(self) -> bool:
        return is_buffer_handle(self.id)

    @classmethod
    def from_kv(cls, kv: KV) -> HandleView:
        data = decode(kv.key, kv.value)
        record = HandleRecord.from_dict(kv.key, data)
        created = record.created_at or float(record.attributes.get("createdAt") or 0)
        return cls(**{**fields_of(record), "created_at": created}, key=kv.key, rev=kv.mod_revision)


@dataclass(frozen=True)
class Snapshot:
    revision: int
    pools: Mapping[str, PoolView]
    blocks: Mapping[str, BlockView]  # by key
    handles: Mapping[str, HandleView]  # by id
    nodes: Mapping[str, dict]
    alive: frozenset[str]  # nodes whose heartbeat key exists
    corrupt: tuple[tuple[str, str], ...] = ()  # (key, why)
    affinities: Mapping[str, int] = field(default_factory=dict)  # affinity key -> revision

    def blocks_of(self, pool: str) -> list[BlockView]:
        return sorted(
            (b for b in self.blocks.values() if b.pool == pool),
            key=lambda b: (b.net.version, b.net),
        )

    def spec(self, pool: str) -> PoolSpec | None:
        view = self.pools.get(pool)
        return view.spec if view else None


def parse_snapshot(kvs: Iterable[KV], revision: int) -> Snapshot:
    pools, blocks, handles, nodes, alive, corrupt = {}, {}, {}, {}, set(), []
    affinities = {}
    for kv in kvs:
        try:
            if kv.key.startswith(AFFINITY):
                affinities[kv.key] = kv.mod_revision
            elif kv.key.startswith(POOLS):
                pools[kv.key[len(POOLS) :]] = parse_pool(kv)
            elif kv.key.startswith(BLOCKS):
                blocks[kv.key] = BlockView.from_kv(kv)
            elif kv.key.startswith(HANDLES):
                view = HandleView.from_kv(kv)
                handles[view.id] = view
            elif kv.key.startswith(NODES):
                nodes[kv.key[len(NODES) :]] = decode(kv.key, kv.value)
            elif kv.key.startswith(HEARTBEATS):
                alive.add(kv.key[len(HEARTBEATS) :])
        except CorruptRecord as exc:
            corrupt.append((kv.key, exc.details))
    return Snapshot(
        revision, pools, blocks, handles, nodes, frozenset(alive), tuple(corrupt), affinities
    )


def parse_pool(kv: KV) -> PoolView:
    name = kv.key[len(POOLS) :]
    record = decode(kv.key, kv.value)
    try:
        return PoolView(name, kv.mod_revision, record, spec_from_record({**record, "name": name}))
    except PoolInvalid as exc:
        return PoolView(name, kv.mod_revision, record, None, str(exc))

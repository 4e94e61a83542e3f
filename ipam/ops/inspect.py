"""What the store holds, read as one snapshot, and utilisation counted from it (pure).

``parse_snapshot`` turns the key-values under ``/pycni/v1/`` (read in one range, so at one
revision) into views of pools, blocks, handles and nodes; a corrupt record becomes an entry
of ``Snapshot.corrupt`` instead of an exception. ``calc_block_usage`` and ``calc_pool_usage``
are the one place utilisation is counted (size, reserved, used, cooling, borrowed, free):
``pycni ipam show`` and the per-pool metrics count the same way. The reports built on top
live in ``inspect_show`` (show) and ``inspect_check`` (check/gc).
"""
from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ipam.alloc.pool_settings import PoolInvalid
from ipam.alloc.pool_spec import IPNet, PoolSpec, spec_from_record
from ipam.store.base import KV, PREFIX

POOLS = f"{PREFIX}pools/"
BLOCKS = f"{PREFIX}blocks/"
HANDLES = f"{PREFIX}handles/"
NODES = f"{PREFIX}nodes/"
HEARTBEATS = f"{PREFIX}heartbeats/"
AFFINITY = f"{PREFIX}affinity/"  # /pycni/v1/affinity/<node>/<pool>/<block>: a node's block index
BUFFER_NETWORK = "_buffer"  # /pycni/v1/handles/_buffer/<node>/<pool>: a node's outage buffer


class CorruptRecord(ValueError):
    pass


def load_json(value: bytes) -> dict:
    try:
        data = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptRecord(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CorruptRecord("not a JSON object")
    return data


@dataclass(frozen=True)
class PoolView:
    name: str
    rev: int
    record: dict
    spec: PoolSpec | None  # None: the record is unusable (``error`` says why)
    error: str = ""


@dataclass(frozen=True)
class BlockView:
    key: str
    rev: int
    pool: str
    cidr: str
    net: IPNet
    affinity: str
    allocations: Mapping[str, str]  # ip -> handle id ("network/containerID/ifname")
    released: Mapping[str, float] = field(default_factory=dict)  # ip -> unix time
    empty_since: float | None = None
    record: dict = field(default_factory=dict)

    @classmethod
    def from_record(cls, key: str, rev: int, data: Mapping[str, Any]) -> "BlockView":
        pool, _, cidr_text = key[len(BLOCKS):].rpartition("/")
        address, _, prefix = cidr_text.rpartition("-")
        try:
            net = ipaddress.ip_network(f"{address}/{prefix}")
            allocations = {str(a): str(h) for a, h in (data.get("allocations") or {}).items()}
            released = {str(a): float(t) for a, t in (data.get("released") or {}).items()}
            empty = data.get("emptySince")
            return cls(key, rev, pool, str(net), net, str(data.get("affinity") or ""),
                       allocations, released, float(empty) if empty else None, dict(data))
        except (TypeError, ValueError, AttributeError) as exc:
            raise CorruptRecord(f"bad block record: {exc!r}") from None


@dataclass(frozen=True)
class HandleIP:
    ip: str
    address: str  # with the prefix length: "10.22.0.5/16"
    pool: str
    block: str
    gateway: str | None = None

    @property
    def block_key(self) -> str:
        return f"{BLOCKS}{self.pool}/{self.block.replace('/', '-')}"


@dataclass(frozen=True)
class HandleView:
    key: str
    rev: int
    id: str  # as block allocations name it: "network/containerID/ifname"
    ips: tuple[HandleIP, ...]
    attributes: Mapping[str, str]
    created_at: float = 0.0
    record: dict = field(default_factory=dict)

    @property
    def network(self) -> str:
        return self.id.split("/", 1)[0]

    @property
    def node(self) -> str:
        return self.attributes.get("node", "")

    @property
    def is_buffer(self) -> bool:
        return self.network == BUFFER_NETWORK

    @classmethod
    def from_record(cls, key: str, rev: int, data: Mapping[str, Any]) -> "HandleView":
        try:
            ips = tuple(HandleIP(str(ip["address"]).split("/")[0], str(ip["address"]),
                                 str(ip["pool"]), str(ip["block"]), ip.get("gateway"))
                        for ip in data.get("ips") or ())
            attributes = {str(k): str(v) for k, v in (data.get("attributes") or {}).items()}
            created = data.get("createdAt") or attributes.get("createdAt") or 0
            return cls(key, rev, key[len(HANDLES):], ips, attributes, float(created), dict(data))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptRecord(f"bad handle record: {exc!r}") from None


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
        return sorted((b for b in self.blocks.values() if b.pool == pool),
                      key=lambda b: (b.net.version, b.net))

    def spec(self, pool: str) -> PoolSpec | None:
        view = self.pools.get(pool)
        return view.spec if view else None


def affinity_key(node: str, block_key: str) -> str:
    """The index key of a block claimed by ``node`` (same layout as ``ipam.records``)."""
    return f"{AFFINITY}{node}/{block_key[len(BLOCKS):]}"


def parse_snapshot(kvs: Iterable[KV], revision: int) -> Snapshot:
    pools, blocks, handles, nodes, alive, corrupt = {}, {}, {}, {}, set(), []
    affinities = {}
    for kv in kvs:
        try:
            if kv.key.startswith(AFFINITY):
                affinities[kv.key] = kv.mod_revision
            elif kv.key.startswith(POOLS):
                pools[kv.key[len(POOLS):]] = parse_pool(kv)
            elif kv.key.startswith(BLOCKS):
                blocks[kv.key] = BlockView.from_record(kv.key, kv.mod_revision, load_json(kv.value))
            elif kv.key.startswith(HANDLES):
                view = HandleView.from_record(kv.key, kv.mod_revision, load_json(kv.value))
                handles[view.id] = view
            elif kv.key.startswith(NODES):
                nodes[kv.key[len(NODES):]] = load_json(kv.value)
            elif kv.key.startswith(HEARTBEATS):
                alive.add(kv.key[len(HEARTBEATS):])
        except CorruptRecord as exc:
            corrupt.append((kv.key, str(exc)))
    return Snapshot(revision, pools, blocks, handles, nodes, frozenset(alive), tuple(corrupt),
                    affinities)


def parse_pool(kv: KV) -> PoolView:
    name = kv.key[len(POOLS):]
    record = load_json(kv.value)
    try:
        return PoolView(name, kv.mod_revision, record, spec_from_record({**record, "name": name}))
    except PoolInvalid as exc:
        return PoolView(name, kv.mod_revision, record, None, str(exc))


# -- utilisation: the one place it is counted ----------------------------------------------------

@dataclass(frozen=True)
class Usage:
    capacity: int  # addresses that can ever be handed out
    used: int
    cooling: int  # released, within the pool's reuse delay
    borrowed: int  # held by a handle of a node other than the block's

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.used - self.cooling)

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.capacity + other.capacity, self.used + other.used,
                     self.cooling + other.cooling, self.borrowed + other.borrowed)

    def to_dict(self) -> dict:
        return {"capacity": self.capacity, "used": self.used, "free": self.free,
                "cooling": self.cooling, "borrowed": self.borrowed}


def is_cooling(block: BlockView, ip: str, reuse_delay: float, now: float) -> bool:
    released = block.released.get(ip)
    return ip not in block.allocations and released is not None and now < released + reuse_delay


def is_borrowed(block: BlockView, ip: str, handle: HandleView | None) -> bool:
    """An address the block marks borrowed, or held by a handle of another node."""
    if ip in (block.record.get("borrowed") or {}):
        return True
    if handle is None:  # (a handle's borrowedFrom attribute names no address: not used)
        return False
    return bool(handle.node and block.affinity and handle.node != block.affinity)


def calc_block_usage(spec: PoolSpec, block: BlockView, handles: Mapping[str, HandleView],
                     now: float) -> Usage:
    return Usage(spec.block_capacity(block.net), len(block.allocations),
                 sum(1 for ip in block.released if is_cooling(block, ip, spec.reuse_delay, now)),
                 sum(1 for ip, h in block.allocations.items()
                     if is_borrowed(block, ip, handles.get(h))))


def calc_pool_usage(spec: PoolSpec, blocks: Iterable[BlockView],
                    handles: Mapping[str, HandleView], now: float) -> Usage:
    """The whole pool: capacity is ``spec.size`` (claimed blocks or not)."""
    total = Usage(0, 0, 0, 0)
    for block in blocks:
        total = total + calc_block_usage(spec, block, handles, now)
    return Usage(spec.size, total.used, total.cooling, total.borrowed)

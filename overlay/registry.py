"""The overlay's view of the node registry, kept from the store's watch events (no I/O here).

Four prefixes feed it: cluster pools (their CIDRs: a pool of a new family gets a VTEP), node
records (``/nodes/``: backend, underlay, VTEP), the affinity index
(``/affinity/<node>/<pool>/<block>``: which blocks a node serves; nothing is copied into the
node record) and block records (``/blocks/``: only their ``borrowed`` map, the addresses a node
holds in another node's block). A record that cannot be read is logged once and ignored — a
bad record of one node must not take the routes of every other node down.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from common.skipped import Skipped
from ipam.records import BlockRecord
from nodes.record import NodeRecord
from overlay.model import Peer
from store.base import KV
from store.codec import CorruptRecord, decode
from store.keys import AFFINITY, BLOCKS, NODES, POOLS, parse_block_key

log = logging.getLogger("pycnid.overlay")
PREFIXES = (NODES, AFFINITY, BLOCKS, POOLS)


@dataclass
class Registry:
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    affinity: dict[str, set[str]] = field(default_factory=dict)  # node -> block CIDRs
    borrowed: dict[str, dict[str, str]] = field(default_factory=dict)  # block key -> {ip: node}
    held6: dict[str, dict[str, str]] = field(default_factory=dict)  # IPv6 block -> {ip: holder}
    pools: dict[str, str] = field(default_factory=dict)  # cluster pool -> CIDR
    bad: Skipped = field(default_factory=lambda: Skipped("overlay", log))

    def apply(self, kv: KV, deleted: bool = False) -> bool:
        """One put or delete; True when it can change what the overlay programs."""
        if deleted:
            self.bad.clear(kv.key)
        try:
            if kv.key.startswith(NODES):
                return self.apply_node(kv, deleted)
            if kv.key.startswith(AFFINITY):
                return self.apply_affinity(kv.key, deleted)
            if kv.key.startswith(BLOCKS):
                return self.apply_block(kv, deleted)
            if kv.key.startswith(POOLS):
                return self.apply_pool(kv, deleted)
        except (CorruptRecord, ValueError) as exc:
            self.bad.note(kv.key, exc)
        return False

    def apply_node(self, kv: KV, deleted: bool) -> bool:
        name = kv.key[len(NODES) :]
        if deleted:
            return self.nodes.pop(name, None) is not None
        record = NodeRecord.from_bytes(kv.key, kv.value)
        self.bad.clear(kv.key)
        before = self.nodes.get(name)
        self.nodes[name] = record
        return before is None or before.overlay != record.overlay

    def apply_affinity(self, key: str, deleted: bool) -> bool:
        node = key[len(AFFINITY) :].split("/", 1)[0]
        _, cidr = parse_block_key(key)
        blocks = self.affinity.setdefault(node, set())
        if deleted:
            if cidr not in blocks:
                return False
            blocks.discard(cidr)
            return True
        if cidr in blocks:
            return False
        blocks.add(cidr)
        return True

    def apply_block(self, kv: KV, deleted: bool) -> bool:
        block = None if deleted else BlockRecord.at_key(kv.key, kv.value)
        borrowed = changed(self.borrowed, kv.key, dict(block.borrowed) if block else {})
        held = (
            {}
            if block is None or block.net.version != 6
            else {ip: block.borrowed.get(ip, block.affinity) for ip in block.allocations}
        )
        return changed(self.held6, kv.key, held) or borrowed

    def apply_pool(self, kv: KV, deleted: bool) -> bool:
        """A cluster pool's CIDR (its VTEP family, the cluster's address space)."""
        name = kv.key[len(POOLS) :]
        record = {} if deleted else decode(kv.key, kv.value)
        cidr = "" if record.get("source") == "netconf" else str(record.get("cidr") or "")
        before = self.pools.pop(name, "")
        if cidr:
            self.pools[name] = cidr
        return cidr != before

    def replace_all(self, kvs: Iterable[KV], prefix: str) -> None:
        """A snapshot of one prefix: what it holds replaces what was known under it."""
        if prefix == NODES:
            self.nodes.clear()
        elif prefix == AFFINITY:
            self.affinity.clear()
        elif prefix == BLOCKS:
            self.borrowed.clear()
            self.held6.clear()
        elif prefix == POOLS:
            self.pools.clear()
        present: set[str] = set()
        for kv in kvs:
            present.add(kv.key)
            self.apply(kv)
        self.bad.keep_only(prefix, present)

    def hosts_of(self, node: str) -> tuple[str, ...]:
        return tuple(
            sorted(
                ip
                for held in self.borrowed.values()
                for ip, holder in held.items()
                if holder == node
            )
        )

    def held6_by(self, node: str) -> tuple[str, ...]:
        return tuple(
            sorted(
                ip for held in self.held6.values() for ip, holder in held.items() if holder == node
            )
        )

    def peers(self, self_name: str) -> list[Peer]:
        """Every other node with overlay fields, with its blocks and borrowed addresses."""
        return [
            Peer(
                name,
                record.overlay,
                tuple(sorted(self.affinity.get(name, ()))),
                self.hosts_of(name),
                self.held6_by(name),
            )
            for name, record in sorted(self.nodes.items())
            if name != self_name and record.overlay is not None
        ]


def changed(table: dict[str, dict[str, str]], key: str, new: dict[str, str]) -> bool:
    """Set ``table[key]`` (dropped when empty); whether it changed."""
    old = table.get(key, {})
    if new:
        table[key] = new
    else:
        table.pop(key, None)
    return new != old

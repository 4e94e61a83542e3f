"""`pycni node`'s behaviour: the cluster's nodes as the store knows them, and taking one out.

A node is anything the store names: a node record (``nodes.record``), a heartbeat, an
affinity index entry (its blocks) or a reaper suspicion, so a node whose record is gone but whose
blocks remain still shows (and can be removed). Health: with heartbeats (etcd) a node is alive
while its heartbeat key exists, shown with the lease's remaining TTL (or, when the store cannot
say, the age since the heartbeat was granted); a store without heartbeats (SQLite, one node)
cannot tell. ``remove_node`` releases what the reaper would (``nodes.reaper``) and then
forgets the node, so peers drop their routes to it (the overlay follows the node records).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cni.spec.errors import CNIError, InvalidConfig
from ipam.records import BlockRecord
from nodes.liveness import supports_leases
from nodes.reaper import forget_node, release_node, suspect_key
from nodes.record import NodeRecord, heartbeat_key, node_key
from store.base import KV, Compare, Delete, Store
from store.codec import decode
from store.keys import (
    AFFINITY,
    BLOCKS,
    HEARTBEATS,
    NODES,
    SUSPECTS,
    affinity_prefix,
    parse_block_key,
)

Reach = Callable[[str], "str | None"]  # underlay address -> None (direct) or why not


class NodeNotFound(InvalidConfig):
    """No record, heartbeat, block or suspicion names the node."""


@dataclass(frozen=True)
class Beat:
    """What a heartbeat value says (``nodes.liveness.write_node`` writes it)."""

    lease: int | None = None
    granted_at: float | None = None


def parse_heartbeat(kv: KV) -> Beat:
    """The lease and grant time of a heartbeat; an unreadable one is still a heartbeat."""
    try:
        data = decode(kv.key, kv.value)
    except CNIError:
        return Beat()
    return Beat(parse_lease(data.get("lease")), parse_time(data.get("grantedAt")))


def parse_lease(value: object) -> int | None:
    try:
        lease = int(str(value), 16)
    except ValueError:
        return None
    return lease if lease > 0 else None


def parse_time(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value and abs(value) < 1e12 else None  # not NaN / inf


def calc_health(
    beat: Beat | None,
    leases: bool,
    now: float,
    ttl: int | None = None,
    suspect_since: float | None = None,
) -> dict:
    """The health column: alive/dead (unknown without heartbeats) and how we know (pure)."""
    age = round(now - beat.granted_at, 1) if beat and beat.granted_at is not None else None
    state = "unknown" if not leases else "alive" if beat is not None else "dead"
    doc = {
        "state": state,
        "heartbeat": beat is not None,
        "leaseTTL": ttl,
        "age": age,
        "suspectSince": suspect_since,
    }
    return {**doc, "text": render_health(doc, now)}


def render_health(doc: dict, now: float) -> str:
    if doc["state"] == "unknown":
        return "no heartbeat (SQLite)"
    if doc["state"] == "dead":
        since = doc["suspectSince"]
        return "dead (no heartbeat" + (f"; suspect for {now - since:.0f} s)" if since else ")")
    if doc["leaseTTL"] is not None and doc["leaseTTL"] >= 0:
        return f"alive (lease {doc['leaseTTL']} s left)"
    return (
        f"alive (heartbeat granted {doc['age']:.0f} s ago)" if doc["age"] is not None else "alive"
    )


@dataclass
class Cluster:
    """One read of everything `node ls` shows: records, heartbeats, suspicions, blocks."""

    records: dict[str, KV] = field(default_factory=dict)
    beats: dict[str, KV] = field(default_factory=dict)
    suspects: dict[str, KV] = field(default_factory=dict)
    blocks: dict[str, list[dict]] = field(default_factory=dict)
    leases: bool = False

    @property
    def names(self) -> list[str]:
        return sorted({*self.records, *self.beats, *self.suspects, *self.blocks} - {""})


def by_node(store: Store, prefix: str) -> dict[str, KV]:
    return {kv.key[len(prefix) :]: kv for kv in store.range(prefix)}


def read_cluster(store: Store) -> Cluster:
    blocks: dict[str, list[dict]] = {}
    for kv in store.range(AFFINITY, keys_only=True):
        pool, cidr = parse_block_key(kv.key)
        node = kv.key[len(AFFINITY) :].split("/", 1)[0]
        blocks.setdefault(node, []).append({"pool": pool, "cidr": cidr})
    return Cluster(
        by_node(store, NODES),
        by_node(store, HEARTBEATS),
        by_node(store, SUSPECTS),
        blocks,
        supports_leases(store),
    )


def lease_ttl(store: Store, beat: Beat | None) -> int | None:
    """Seconds left on the heartbeat's lease, when the store can say (etcd)."""
    ask = getattr(store, "lease_ttl", None)
    if beat is None or beat.lease is None or not callable(ask):
        return None
    return int(ask(beat.lease))


def suspect_since(kv: KV | None) -> float | None:
    if kv is None:
        return None
    try:
        return parse_time(decode(kv.key, kv.value).get("since"))
    except CNIError:
        return None


def describe_node(store: Store, cluster: Cluster, name: str, now: float) -> dict:
    """One row of `node ls` (JSON-ready): the record's fields, #blocks and health."""
    row: dict = {
        "name": name,
        "record": name in cluster.records,
        "address": "",
        "labels": {},
        "startedAt": None,
        "overlay": None,
        "blockCount": len(cluster.blocks.get(name, [])),
    }
    if name in cluster.records:
        row.update(read_record(cluster.records[name]))
    beat = parse_heartbeat(cluster.beats[name]) if name in cluster.beats else None
    row["health"] = calc_health(
        beat,
        cluster.leases,
        now,
        lease_ttl(store, beat),
        suspect_since(cluster.suspects.get(name)),
    )
    return row


def read_record(kv: KV) -> dict:
    try:
        record = NodeRecord.from_bytes(kv.key, kv.value)
    except CNIError as exc:
        return {"error": str(exc)}
    return {
        "address": record.address,
        "labels": dict(record.labels),
        "startedAt": record.started_at or None,
        "overlay": record.overlay.to_dict() if record.overlay else None,
    }


def list_nodes(store: Store, now: float) -> list[dict]:
    cluster = read_cluster(store)
    return [describe_node(store, cluster, name, now) for name in cluster.names]


def list_borrowed(store: Store, node: str) -> list[dict]:
    """Addresses ``node`` holds in other nodes' blocks (routed to it as host routes)."""
    out = []
    for kv in store.range(BLOCKS):
        block = BlockRecord.at_key(kv.key, kv.value)
        out += [
            {"address": ip, "pool": block.pool, "block": block.cidr, "owner": block.affinity}
            for ip, holder in sorted(block.borrowed.items())
            if holder == node
        ]
    return out


def show_node(store: Store, name: str, now: float, reach: Reach | None = None) -> dict:
    """`node show`: the row plus its blocks, borrowed addresses and (host-gw) reachability."""
    cluster = read_cluster(store)
    if name not in cluster.names:
        raise NodeNotFound(f"no node {name}", "pycni node ls lists the nodes the store knows")
    doc = describe_node(store, cluster, name, now)
    doc["blocks"] = sorted(cluster.blocks.get(name, []), key=lambda b: (b["pool"], b["cidr"]))
    doc["borrowed"] = list_borrowed(store, name)
    doc["reachability"] = calc_reachability(doc["overlay"], reach)
    return doc


def calc_reachability(overlay: dict | None, reach: Reach | None) -> str | None:
    """host-gw only: "direct", or why this host would not route to the peer's underlay."""
    if overlay is None or overlay.get("backend") != "host-gw" or reach is None:
        return None
    return reach(overlay["underlay"]) or "direct"


def is_known(store: Store, name: str) -> bool:
    keys = (node_key(name), heartbeat_key(name), suspect_key(name))
    return any(store.get(k) is not None for k in keys) or bool(
        store.range(affinity_prefix(name), keys_only=True, limit=1)
    )


def remove_node(store: Store, name: str, *, force: bool = False, dry_run: bool = False) -> dict:
    """Release what the reaper would for ``name`` (refused while its heartbeat lives unless
    ``force``), then forget it: node record and suspicion, with ``force`` the heartbeat too.
    Unforced, every txn also compares the node record as read: a node that re-announces
    itself mid-way stops the removal."""
    if not is_known(store, name):
        raise NodeNotFound(f"no node {name}", "pycni node ls lists the nodes the store knows")
    record = store.get(node_key(name))
    guards = [] if force else [Compare(node_key(name), record.mod_revision if record else 0)]
    report = release_node(store, name, force=force, guards=guards, dry_run=dry_run)
    done = {"heartbeatDeleted": False, "forgotten": False}
    if report.complete and not dry_run:
        done = forget(store, name, guards, force)
    return {
        "node": name,
        "dryRun": dry_run,
        "force": force,
        "hadRecord": record is not None,
        "release": report.to_dict(),
        "complete": report.complete,
        **done,
        "summary": report.summary(),
    }


def forget(store: Store, name: str, guards: list[Compare], force: bool) -> dict:
    """After a complete release: the heartbeat first (``force`` only: a live node taken out),
    then the record and suspicion as the reaper forgets a dead node."""
    beat = store.get(heartbeat_key(name)) if force else None
    deleted = (
        beat is not None
        and store.txn([Compare(beat.key, beat.mod_revision)], [Delete(beat.key)]).succeeded
    )
    forget_node(store, name, guards)
    return {"heartbeatDeleted": deleted, "forgotten": store.get(node_key(name)) is None}

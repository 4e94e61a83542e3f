"""The txns that take a node's addresses back: guarded handle releases and block returns.

Mechanism for ``nodes/reaper.py`` (policy: when a node counts as dead). Every txn compares the
``mod_revision`` of each key it read (the handle, each block it frees an address in, the block
it deletes) plus the caller's *guards* (heartbeat absent, node record unchanged ...). When a
txn fails, the guards are read again: one that moved means the node came back, and everything
stops (``GuardFailed``); otherwise the handle is re-read and, if it still belongs to the node
(Calico's ABA rule: re-validate right before releasing), released again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from cni.spec.errors import CNIError, TryAgainLater
from ipam.alloc.pool_spec import DEFAULT_REUSE_DELAY
from ipam.records import BlockRecord, HandleRecord
from store.base import KV, Compare, Delete, Op, Put, Store
from store.cas import LOST, Lost, Retry, run_cas
from store.codec import decode
from store.keys import BLOCKS, HANDLES, affinity_key, block_key, pool_key

ATTEMPTS = 16
RETRY = Retry(ATTEMPTS, base=0.001, cap=0.05, jitter=True)


class GuardFailed(TryAgainLater):
    """A guard key changed during the reclamation (the node came back)."""


@dataclass
class ReleaseReport:
    node: str
    released: list[dict] = field(default_factory=list)  # {"handle", "ips"}
    blocks_returned: list[str] = field(default_factory=list)  # "<pool>/<cidr>"
    blocks_kept: list[dict] = field(default_factory=list)  # {"block", "held"}
    errors: list[str] = field(default_factory=list)
    stopped: str = ""  # why the reclamation stopped half-way (a guard moved)

    @property
    def complete(self) -> bool:
        return not self.stopped and not self.errors

    @property
    def cooling(self) -> bool:
        """Some empty block waits for its reuse delay before it can be returned."""
        return any(k.get("cooling") and not k.get("held") for k in self.blocks_kept)

    @property
    def released_ips(self) -> list[str]:
        return [ip for entry in self.released for ip in entry["ips"]]

    def summary(self) -> str:
        text = (
            f"{len(self.released)} handle(s), {len(self.released_ips)} address(es) released, "
            f"{len(self.blocks_returned)} block(s) returned, {len(self.blocks_kept)} kept"
        )
        if self.stopped:
            text += f"; stopped: {self.stopped}"
        return text + (f"; {len(self.errors)} error(s)" if self.errors else "")

    def to_dict(self) -> dict:
        return {
            "node": self.node,
            "released": self.released,
            "blocksReturned": self.blocks_returned,
            "blocksKept": self.blocks_kept,
            "errors": self.errors,
            "stopped": self.stopped,
            "complete": self.complete,
        }


def calc_freed_block(block: BlockRecord, ip: str, now: float) -> BlockRecord:
    """Free ``ip`` and start its reuse delay (a pod elsewhere may still have it cached)."""
    return block.without(ip, released_at=now)


def pool_reuse_delay(store: Store, pool: str) -> float:
    kv = store.get(pool_key(pool))
    value = decode(kv.key, kv.value).get("reuseDelay") if kv else None
    return float(value) if isinstance(value, (int, float)) else DEFAULT_REUSE_DELAY


def check_guards(store: Store, guards: Sequence[Compare]) -> None:
    for guard in guards:
        kv = store.get(guard.key)
        now = kv.mod_revision if kv else 0
        if now != guard.mod_revision:
            raise GuardFailed(
                f"{guard.key} changed (revision {guard.mod_revision} -> {now})",
                "the node came back; nothing more is reclaimed",
            )


def plan_release(
    store: Store, kv: KV, record: HandleRecord, guards: Sequence[Compare]
) -> tuple[list[Compare], list[Op]]:
    """Delete the handle and free each of its addresses still recorded as its own."""
    compares = {kv.key: kv.mod_revision, **{g.key: g.mod_revision for g in guards}}
    blocks: dict[str, tuple[int, BlockRecord]] = {}
    changed: list[str] = []
    for ip in record.ips:
        key = block_key(ip.pool, ip.block)
        if key not in blocks:
            found = store.get(key)
            if found is None:
                continue
            blocks[key] = (found.mod_revision, BlockRecord.from_bytes(found.key, found.value))
        revision, block = blocks[key]
        if block.allocations.get(ip.ip) == str(record.handle):
            blocks[key] = (revision, calc_freed_block(block, ip.ip, time.time()))
            compares[key] = revision
            changed.append(key)
    ops: list[Op] = [Delete(kv.key)]
    ops += [Put(key, blocks[key][1].to_bytes()) for key in dict.fromkeys(changed)]
    return [Compare(k, r) for k, r in compares.items()], ops


def release_guarded(
    store: Store, kv: KV, node: str, guards: Sequence[Compare]
) -> HandleRecord | None:
    """Release one handle of ``node``; None when it vanished or is no longer the node's."""
    current = kv

    def attempt() -> HandleRecord | None | Lost:
        nonlocal current
        record = HandleRecord.from_bytes(current.key, current.value)
        if record.node != node:
            return None
        compares, ops = plan_release(store, current, record, guards)
        if store.txn(compares, ops).succeeded:
            return record
        check_guards(store, guards)
        found = store.get(current.key)
        if found is None:
            return None
        current = found
        return LOST

    return run_cas(
        attempt,
        RETRY,
        TryAgainLater(
            f"could not release {kv.key} after {ATTEMPTS} attempts",
            f"the store {store.name} is contended",
        ),
    )


def release_node_handles(
    store: Store, node: str, guards: Sequence[Compare], report: ReleaseReport, dry_run: bool
) -> None:
    for kv in store.range(HANDLES):
        record = HandleRecord.from_bytes(kv.key, kv.value)
        if record.node != node:
            continue
        try:
            released = record if dry_run else release_guarded(store, kv, node, guards)
        except GuardFailed:
            raise
        except CNIError as exc:
            report.errors.append(f"{record.handle}: {exc}")
            continue
        if released is not None:
            report.released.append(
                {"handle": str(released.handle), "ips": [ip.ip for ip in released.ips]}
            )


def return_empty_blocks(
    store: Store, node: str, guards: Sequence[Compare], report: ReleaseReport, dry_run: bool
) -> None:
    """Delete the node's blocks that hold nothing and cool nothing, with their affinity index
    key (in a dry run: blocks that would hold nothing once the node's handles are gone).
    A block kept because of its reuse delay is returned by a later pass."""
    gone = {entry["handle"] for entry in report.released} if dry_run else set()
    now = time.time()
    for kv in store.range(BLOCKS):
        block = BlockRecord.from_bytes(kv.key, kv.value)
        if block.affinity != node:
            continue
        name = f"{block.pool}/{block.cidr}"
        held = [ip for ip, holder in block.allocations.items() if holder not in gone]
        cooling = block.cooling(now, pool_reuse_delay(store, block.pool))
        if held or (cooling and not dry_run):
            report.blocks_kept.append({"block": name, "held": len(held), "cooling": len(cooling)})
        elif dry_run or delete_block(store, kv, block, node, guards):
            report.blocks_returned.append(name)
        else:
            check_guards(store, guards)
            report.blocks_kept.append({"block": name, "held": -1})  # changed under us


def delete_block(
    store: Store, kv: KV, block: BlockRecord, node: str, guards: Sequence[Compare]
) -> bool:
    """One txn: the block and its affinity index key, both compared as read."""
    index = affinity_key(node, block.pool, block.cidr)
    found = store.get(index)
    compares = [
        Compare(kv.key, kv.mod_revision),
        Compare(index, found.mod_revision if found else 0),
        *guards,
    ]
    ops: list[Op] = [Delete(kv.key)]
    if found:
        ops.append(Delete(index))
    return store.txn(compares, ops).succeeded

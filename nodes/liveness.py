"""Node liveness: the node record, and a heartbeat key on an etcd lease kept alive by a loop.

Keys (docs/store-layout.md, "Nodes and heartbeats")::

    /pycni/v1/nodes/<node>        {"name", "address", "labels", "startedAt", "overlay"}  no lease
    /pycni/v1/heartbeats/<node>   {"node", "lease", "grantedAt", "pid"}           on the lease

On start pycnid asks the store for a lease of ``heartbeatTTL`` seconds (default 10) kept alive
by the store's keepalive loop (``EtcdStore.keep_lease``: refresh every TTL/3, keep trying while
etcd is unreachable, grant a new lease when the old one expired). Every (re-)grant writes both
keys in one txn comparing their revisions, so the node record's ``mod_revision`` moves each
time the node (re)appears: the reaper (``nodes/reaper.py``) reads that as "it came back".

Allocations are never tied to the lease: a lost heartbeat makes the node a *suspect*, nothing
more; its addresses are reclaimed only after a grace period confirmed on a second look.

With the SQLite store (one node; no other node could reclaim anything) there is no lease and
no heartbeat: the node record is written once and the reaper never runs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol, TypeGuard

from cni.spec.errors import CNIError, TryAgainLater
from nodes.record import NodeRecord, heartbeat_key, node_key
from store.base import Compare, Delete, Put, Store
from store.cas import LOST, Lost, Retry, run_cas
from store.codec import encode
from store.etcd_lease import LeaseKeeper

log = logging.getLogger("pycnid.liveness")
WRITE_ATTEMPTS = 8
WRITE_RETRY = Retry(WRITE_ATTEMPTS)  # at once: each attempt re-reads both keys


class LeaseStore(Store, Protocol):
    """A store that keeps a lease alive (``EtcdStore``)."""

    def keep_lease(
        self, ttl: int, on_grant: Callable[[int], None] | None = None
    ) -> LeaseKeeper: ...


def supports_leases(store: Store) -> TypeGuard[LeaseStore]:
    """Only a store with leases (etcd) can carry heartbeats, hence the reaper too."""
    return callable(getattr(store, "keep_lease", None))


def heartbeat_alive(store: Store, node: str) -> bool:
    return store.get(heartbeat_key(node)) is not None


def write_node(
    store: Store, record: NodeRecord, lease_id: int = 0, clock: Callable[[], float] = time.time
) -> int:
    """Write the node record (and, with ``lease_id``, the heartbeat on it) in one txn that
    compares both keys as read; retried on conflict. Returns the revision written at."""
    keys = [node_key(record.name)] + ([heartbeat_key(record.name)] if lease_id else [])
    beat = encode(
        {"node": record.name, "lease": f"{lease_id:x}", "grantedAt": clock(), "pid": os.getpid()}
    )
    ops = [Put(keys[0], record.to_bytes())]
    if lease_id:
        ops.append(Put(keys[1], beat, lease=lease_id))

    def attempt() -> int | Lost:
        compares = [Compare(k, kv.mod_revision if (kv := store.get(k)) else 0) for k in keys]
        result = store.txn(compares, ops)
        return result.revision if result.succeeded else LOST

    return run_cas(
        attempt,
        WRITE_RETRY,
        TryAgainLater(
            f"could not write the node record of {record.name}",
            f"{WRITE_ATTEMPTS} conflicting writes in {store.name}",
        ),
    )


def with_announced_overlay(store: Store, record: NodeRecord) -> NodeRecord:
    """``record`` with the overlay fields the store's record of this node holds (none there,
    unreadable, or no store reachable: ``record`` as it is). A restarted pycnid announces
    itself before its overlay has said its fields again; a record without them withdraws the
    node from its peers, which dropped its routes until the overlay's first pass (~0.1 s of
    every restart lost to the Pods of the node). Kept, they are what the peers hold already,
    and the overlay's own write (``update``) replaces them if they changed."""
    try:
        kv = store.get(node_key(record.name))
        held = NodeRecord.from_bytes(kv.key, kv.value) if kv is not None else None
    except (CNIError, ValueError) as exc:
        log.info("node record of %s not read before announcing it: %s", record.name, exc)
        return record
    if held is None or held.overlay is None:
        return record
    return replace(record, overlay=held.overlay)


class Liveness:
    """Announces this node: ``start()`` once, ``stop()`` at shutdown (the lease is revoked)."""

    def __init__(self, store: Store, record: NodeRecord, ttl: int) -> None:
        self.store = store
        self.record = record
        self.ttl = ttl
        self.keeper: LeaseKeeper | None = None  # with a lease store only

    def start(self) -> Liveness:
        if supports_leases(self.store):
            self.keeper = self.store.keep_lease(self.ttl, on_grant=self.announce)
        else:
            self.write_record_once()
        return self

    def announce(self, lease_id: int) -> None:
        """Runs in the keepalive thread after every grant; an error makes it try again."""
        write_node(self.store, self.record, lease_id)
        log.info(
            "node %s announced with heartbeat lease %x (TTL %d s)",
            self.record.name,
            lease_id,
            self.ttl,
        )

    def write_record_once(self) -> None:
        try:
            write_node(self.store, self.record)
        except CNIError as exc:
            log.warning("node record of %s not written: %s", self.record.name, exc)

    def update(self, **changes: Any) -> None:
        """A new version of the record (the overlay fields once known), written at once and
        by every later grant."""
        self.record = replace(self.record, **changes)
        write_node(self.store, self.record, self.lease_id)

    def leave(self) -> None:
        """Take the node record out (a graceful leave: peers drop their entries for it)."""
        key = node_key(self.record.name)
        if (kv := self.store.get(key)) is not None:
            self.store.txn([Compare(key, kv.mod_revision)], [Delete(key)])

    def wait(self, timeout: float) -> bool:
        """True once the heartbeat is written (at once without leases)."""
        return self.keeper is None or self.keeper.wait(timeout)

    @property
    def lease_id(self) -> int:
        return self.keeper.lease_id if self.keeper is not None else 0

    def stop(self) -> None:
        if self.keeper is not None:
            self.keeper.stop(revoke=True)

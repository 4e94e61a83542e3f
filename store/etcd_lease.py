"""Keep one etcd lease alive from a background thread, re-granting it when it expired.

pyetcd has lease grant/refresh/revoke but no keepalive loop. ``LeaseKeeper``
refreshes every ``ttl/3`` seconds (on ``common/loop.py``); while etcd is unreachable it keeps
trying (every 0.5 s after each failed call); when
etcd answers that the lease is gone (it expired during an outage, or someone revoked it) it
grants a new one and calls ``on_grant(lease_id)`` so the owner re-writes the keys attached to
it (e.g. the node heartbeat). ``stop(revoke=True)`` ends the thread and revokes the lease, so
those keys vanish at once instead of after the TTL.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from cni.spec.errors import CNIError
from common.loop import Errors, Loop

log = logging.getLogger("pycnid.store.etcd")

RETRY_INTERVAL = 0.5


class LeaseOps(Protocol):
    def grant_lease(self, ttl: int) -> int: ...

    def refresh_lease(self, lease_id: int) -> int: ...

    def revoke_lease(self, lease_id: int) -> None: ...


class LeaseKeeper:
    """A lease kept alive (and re-granted) until ``stop()``;
    ``lease_id`` is 0 while there is none."""

    def __init__(
        self, ops: LeaseOps, ttl: int, on_grant: Callable[[int], None] | None = None
    ) -> None:
        if ttl < 2:
            raise ValueError("a kept lease needs a TTL of at least 2 s")
        self.ttl = int(ttl)
        self.lease_id = 0
        self.grants = 0
        self._ops = ops
        self._on_grant = on_grant
        self._announced = False
        self._ready = threading.Event()
        self.loop = Loop(
            f"etcd-lease-{ttl}s",
            self.step,
            retry=RETRY_INTERVAL,
            errors=Errors(log, "lease keepalive"),
            join_timeout=None,
        )

    def start(self) -> LeaseKeeper:
        self.loop.start()
        return self

    def wait(self, timeout: float) -> bool:
        """True once a lease is granted and ``on_grant`` has run for it."""
        return self._ready.wait(timeout)

    def stop(self, revoke: bool = True) -> None:
        self.loop.stop()
        if revoke and self.lease_id:
            try:
                self._ops.revoke_lease(self.lease_id)
            except CNIError as exc:
                log.warning(
                    "lease %x not revoked: %s (it expires in %d s)", self.lease_id, exc, self.ttl
                )
        self.lease_id = 0

    def step(self) -> float:
        """One round: grant or refresh the lease, announce it if not yet. Seconds to wait."""
        if not self.lease_id:
            self.ensure_granted()
        elif self._ops.refresh_lease(self.lease_id) <= 0:
            log.warning("lease %x expired; granting a new one", self.lease_id)
            self.lease_id, self._announced = 0, False
            self._ready.clear()
            return 0.0
        if not self._announced:
            self.ensure_announced()
        return self.ttl / 3

    def ensure_granted(self) -> None:
        self.lease_id = self._ops.grant_lease(self.ttl)
        self.grants += 1
        self._announced = False

    def ensure_announced(self) -> None:
        if self._on_grant is not None:
            self._on_grant(self.lease_id)
        self._announced = True
        self._ready.set()

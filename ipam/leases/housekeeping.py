"""The IPAM's periodic housekeeping in pycnid: empty blocks go back to their pools, and
failed ADDs whose txn landed after all are rolled back.

Every ``interval`` seconds the node gives back the blocks that have been empty for the grace
period (``LeaseService.return_empty_blocks``: one txn comparing each block and its affinity
index entry, so a block that got an allocation meanwhile is kept) and re-reads its view of the
pools. While an ADD's txn has an unknown outcome (the store failed mid-call), it looks every
0.5 s whether it landed (``LeaseService.resolve_in_doubt``). A failing store is logged and
tried again next time (``common/loop.py``); the loop never dies of it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from common.loop import FOREVER, Errors, Loop, Periodic
from ipam.leases.service import LeaseService

if TYPE_CHECKING:
    from common.metrics import Registry

log = logging.getLogger("pycnid.ipam")
DOUBT_POLL = 0.5


class Housekeeping:
    """Two loops: the rounds (``Periodic``, the first after one interval; none with 0) and the
    in-doubt watcher, woken by ``leases.doubt`` whenever a txn's outcome became unknown."""

    def __init__(
        self, leases: LeaseService, interval: float, registry: Registry | None = None
    ) -> None:
        self.leases = leases
        self.interval = interval
        self.rounds = Periodic(
            "ipam-housekeeping",
            interval,
            self.run_once,
            first=interval,
            errors=Errors(log, "IPAM housekeeping"),
            registry=registry,
        )
        self.doubt = Loop(
            "ipam-in-doubt",
            self.resolve,
            retry=0.0,
            wake=leases.doubt,
            errors=Errors(log, "in-doubt leases not resolved yet", logging.DEBUG),
            registry=registry,
        )

    def start(self) -> Housekeeping:
        if self.interval > 0:
            self.rounds.start()
        self.doubt.start()
        return self

    def stop(self) -> None:
        self.rounds.stop()
        self.doubt.stop()

    def resolve(self) -> float:
        """While a failed ADD may have landed, look every 0.5 s; then sleep until woken."""
        if not self.leases.cache.in_doubt:
            return FOREVER
        self.leases.doubt.clear()
        if not self.doubt.wait(DOUBT_POLL):
            self.leases.resolve_in_doubt()
        return 0.0

    def run_once(self) -> list[str]:
        return self.leases.return_empty_blocks()

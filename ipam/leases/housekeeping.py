"""The IPAM's periodic housekeeping in pycnid: empty blocks go back to their pools, and
failed ADDs whose txn landed after all are rolled back.

Every ``interval`` seconds the node gives back the blocks that have been empty for the grace
period (``LeaseService.return_empty_blocks``: one txn comparing each block and its affinity
index entry, so a block that got an allocation meanwhile is kept) and re-reads its view of the
pools. While an ADD's txn has an unknown outcome (the store failed mid-call), it looks every
0.5 s whether it landed (``LeaseService.resolve_in_doubt``). A failing store is logged and
tried again next time; the thread never dies of it.
"""
from __future__ import annotations

import logging
import threading
import time

from cni.spec.errors import CNIError
from ipam.leases.service import LeaseService

log = logging.getLogger("pycnid.ipam")
DOUBT_POLL = 0.5


class Housekeeping:
    def __init__(self, leases: LeaseService, interval: float) -> None:
        self.leases = leases
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ipam-housekeeping", daemon=True)

    def start(self) -> "Housekeeping":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.leases.doubt.set()  # wake the thread
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        """Rounds every ``interval`` seconds (0: no rounds, only in-doubt resolution)."""
        next_round = time.monotonic() + self.interval if self.interval > 0 else None
        while not self._stop.is_set():
            if self.leases.cache.in_doubt:  # a failed ADD may have landed: look every 0.5 s
                self.leases.doubt.clear()
                self._stop.wait(DOUBT_POLL)
                self.resolve()
            else:
                timeout = None if next_round is None else max(0.0, next_round - time.monotonic())
                if self.leases.doubt.wait(timeout):
                    self.leases.doubt.clear()  # looked at on the next turn
                    continue
            if next_round is not None and time.monotonic() >= next_round:
                self.run_once()
                next_round = time.monotonic() + self.interval

    def resolve(self) -> None:
        try:
            self.leases.resolve_in_doubt()
        except CNIError as err:
            log.debug("in-doubt leases not resolved yet: %s", err)
        except Exception:  # noqa: BLE001 - a bug must not stop the next round
            log.exception("resolving in-doubt leases failed")

    def run_once(self) -> list[str]:
        try:
            return self.leases.return_empty_blocks()
        except CNIError as err:
            log.warning("IPAM housekeeping failed, retrying in %gs: %s", self.interval, err)
        except Exception:  # noqa: BLE001 - a bug must not stop the next round
            log.exception("IPAM housekeeping failed")
        return []

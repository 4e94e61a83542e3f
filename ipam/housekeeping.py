"""The IPAM's periodic housekeeping in pycnid: empty blocks go back to their pools.

Every ``interval`` seconds the node gives back the blocks that have been empty for the grace
period (``LeaseService.return_empty_blocks``: one txn comparing each block and its affinity
index entry, so a block that got an allocation meanwhile is kept) and re-reads its view of the
pools. A failing store is logged and tried again next time; the thread never dies of it.
"""
from __future__ import annotations

import logging
import threading

from cni.spec.errors import CNIError
from ipam.leases import LeaseService

log = logging.getLogger("pycnid.ipam")


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
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.run_once()

    def run_once(self) -> list[str]:
        try:
            return self.leases.return_empty_blocks()
        except CNIError as err:
            log.warning("IPAM housekeeping failed, retrying in %gs: %s", self.interval, err)
        except Exception:  # noqa: BLE001 - a bug must not stop the next round
            log.exception("IPAM housekeeping failed")
        return []

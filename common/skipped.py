"""Records a consumer could not read: skipped, logged once, counted.

A record written by another node (or by hand) that does not decode must never stop a sync:
the proxy, the overlay and NetworkPolicy each leave it out and go on with the others. Each
keeps a ``Skipped``: a key is logged once when it first fails (again only after it read well
or went away in between), and the number of keys skipped right now is the gauge
``pycni_records_skipped{consumer}`` once ``attach`` gave it pycnid's registry.
"""

from __future__ import annotations

import logging

from common.metrics import Gauge, Registry

METRIC = "pycni_records_skipped"
HELP = "store records a consumer leaves out because they cannot be read, now"


class Skipped:
    def __init__(self, consumer: str, log: logging.Logger) -> None:
        self.consumer, self.log = consumer, log
        self.keys: set[str] = set()
        self.gauge: Gauge | None = None

    def attach(self, registry: Registry) -> None:
        self.gauge = registry.gauge(METRIC, HELP)
        self.export()

    def note(self, key: str, why: object) -> None:
        """``key`` could not be read (``why``): logged the first time, counted."""
        if key not in self.keys:
            self.log.warning("%s: ignoring %s: %s", self.consumer, key, why)
            self.keys.add(key)
            self.export()

    def clear(self, key: str) -> None:
        """``key`` read well or went away."""
        if key in self.keys:
            self.keys.discard(key)
            self.export()

    def keep_only(self, prefix: str, present: set[str]) -> None:
        """After a snapshot of ``prefix``: its keys the snapshot no longer holds are gone."""
        for key in [k for k in self.keys if k.startswith(prefix) and k not in present]:
            self.clear(key)

    def export(self) -> None:
        if self.gauge is not None:
            self.gauge.set(len(self.keys), consumer=self.consumer)

    def __contains__(self, key: object) -> bool:
        return key in self.keys

    def __len__(self) -> int:
        return len(self.keys)

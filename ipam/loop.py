"""A background thread that runs one function now and then every ``interval`` seconds, until
stopped: the loop pycnid's periodic jobs share instead of each writing its own.

The function handles its own expected failures; anything it lets escape is logged with its
stack and the next round runs anyway (a bug must not end the loop). ``stop()`` wakes the
thread and waits up to ``join_timeout`` for the round in progress (a daemon thread: a round
stuck in I/O never holds the process up).
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger("pycnid")


class Periodic:
    def __init__(self, name: str, interval: float, run: Callable[[], None], *,
                 join_timeout: float = 5.0) -> None:
        self.name, self.interval, self.run = name, interval, run
        self.join_timeout = join_timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> "Periodic":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.join_timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run()
            except Exception:  # noqa: BLE001 - logged; the next round runs anyway
                log.exception("%s: round failed", self.name)
            self._stop.wait(self.interval)

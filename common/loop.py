"""One background loop for every thread pycnid runs beside its requests.

A ``Loop`` is a named daemon thread that runs ``step()`` again and again until ``stop()``. A step
returns the seconds to pause before the next one (``FOREVER``: until woken), or None when the
loop is done. The pause ends early when the loop's ``wake`` event is set (an owner's "look now")
and at once on ``stop()``, which also waits up to ``join_timeout`` for the step in progress (a
daemon thread: a step stuck in I/O never holds the process up).

A step that raises does not end the loop: the next step comes after ``retry`` seconds (a number,
or a callable such as ``Backoff.next``). Failures are counted (``errors``; with a ``registry``
also ``pycni_loop_errors_total{loop}``) and logged once per failing stretch and kind: an
expected error (``CNIError``: the store is away) as one line, a bug with its stack; the
stretch ends when a step returns or the owner calls ``recovered()`` (a watch stream that is up).

``Periodic`` is the common case: a function run every ``interval`` seconds. This module is a
leaf: it imports nothing of pycni but the errors, so every layer may use it.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cni.spec.errors import CNIError

if TYPE_CHECKING:
    from common.metrics import Registry

log = logging.getLogger("pycnid")
FOREVER = math.inf  # a pause that lasts until the loop is woken or stopped
Step = Callable[[], "float | None"]


class Backoff:
    """Pauses doubling from ``first`` up to ``cap``: ``next()`` gives one and doubles the next,
    ``reset()`` starts again from ``first`` (the owner says when: a loop never resets it)."""

    def __init__(self, first: float, cap: float) -> None:
        self.first, self.cap = first, cap
        self.current = first

    def next(self) -> float:
        pause, self.current = self.current, min(self.current * 2, self.cap)
        return pause

    def reset(self) -> Backoff:
        self.current = self.first
        return self


@dataclass(frozen=True)
class Errors:
    """How a loop reports a failed step: ``expected`` errors as ``label: describe(error)`` at
    ``level``, anything else with its stack; both only for the first failure of a stretch."""

    logger: logging.Logger = log
    label: str = ""
    level: int = logging.WARNING
    expected: tuple[type[BaseException], ...] = (CNIError,)
    describe: Callable[[BaseException], str] = str


class Loop:
    def __init__(
        self,
        name: str,
        step: Step,
        *,
        first: float = 0.0,
        retry: float | Callable[[], float] = 0.5,
        wake: threading.Event | None = None,
        errors: Errors = Errors(),
        registry: Registry | None = None,
        join_timeout: float | None = 5.0,
    ) -> None:
        self.name, self.step, self.first, self.retry = name, step, first, retry
        self.report = errors
        self.join_timeout = join_timeout
        self.errors = 0  # failed steps since the start
        self.failures = 0  # failed steps in a row (the current stretch)
        self._logged: set[bool] = set()  # kinds logged in this stretch (expected or a bug)
        self._counter = (
            registry.counter(
                "pycni_loop_errors_total", "failed steps of pycnid's background loops"
            )
            if registry is not None
            else None
        )
        self._stop = threading.Event()
        self._wake = wake
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def label(self) -> str:
        return self.report.label or self.name

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self) -> Loop:
        self._thread.start()
        return self

    def stop(self, *, wait: bool = True) -> None:
        """End the loop; with ``wait``, also wait for the step in progress (``join``)."""
        self._stop.set()
        if self._wake is not None:
            self._wake.set()
        if wait:
            self.join()

    def join(self) -> None:
        """Wait up to ``join_timeout`` for the thread (never from the loop's own step)."""
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.join_timeout)

    def wait(self, seconds: float) -> bool:
        """For a step: sleep ``seconds`` unless stopped first; True when stopping."""
        return self._stop.wait(seconds)

    def _run(self) -> None:
        pause: float | None = self.first
        while pause is not None and not self._pause(pause):
            pause = self._step()

    def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` (``FOREVER``: until woken); True when the loop is to stop."""
        timeout = None if seconds == FOREVER else max(0.0, seconds)
        if self._wake is None:
            return self._stop.wait(timeout)
        if self._wake.wait(timeout):
            self._wake.clear()
        return self._stop.is_set()

    def _step(self) -> float | None:
        try:
            pause = self.step()
        except Exception as exc:  # noqa: BLE001 - reported; the next step runs anyway
            if self.stopping:
                return None  # interrupted by stop(): nothing to report
            self.failed(exc)
            return self.retry() if callable(self.retry) else self.retry
        self.recovered()
        return pause

    def failed(self, exc: BaseException) -> None:
        """Count a failed step; log it when it starts a failing stretch."""
        self.errors += 1
        self.failures += 1
        if self._counter is not None:
            self._counter.inc(loop=self.name)
        expected = isinstance(exc, self.report.expected)
        first, logger = expected not in self._logged, self.report.logger
        self._logged.add(expected)
        if expected:
            logger.log(
                self.report.level if first else logging.DEBUG,
                "%s: %s",
                self.label,
                self.report.describe(exc),
            )
        elif first:
            logger.error("%s: step failed", self.label, exc_info=exc)
        else:
            logger.debug("%s: step failed again: %r", self.label, exc)

    def recovered(self) -> None:
        """End a failing stretch (a step returned, or the owner knows it works again)."""
        if self.failures:
            self.report.logger.info(
                "%s: working again after %d failed step(s)", self.label, self.failures
            )
        self.failures = 0
        self._logged.clear()


class Periodic(Loop):
    """``run()`` every ``interval`` seconds, the first time after ``first`` (0: at once); a run
    that fails is retried after ``interval`` too."""

    def __init__(
        self,
        name: str,
        interval: float,
        run: Callable[[], object],
        *,
        first: float = 0.0,
        **options: Any,
    ) -> None:
        self.interval, self.run = interval, run
        options.setdefault("retry", interval)
        super().__init__(name, self._run_once, first=first, **options)

    def _run_once(self) -> float:
        self.run()
        return self.interval

"""A fixed pool of long-lived worker threads for pycnid's accept loop.

Each accepted connection goes to an idle worker; threads live as long as the daemon, so what a
plugin keeps per thread (netlink sessions, buffers) is made once, and a request costs no thread
start. When every worker is busy (requests waiting on an attachment lock, a GC, a slow store),
the connection gets a thread of its own, as before the pool: a request never waits for another
one to free a worker, so no request can stall the ones it waits for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger("pycnid.server")

T = TypeVar("T")


class WorkerPool(Generic[T]):
    """``submit(task)`` runs ``run(task)`` on a pooled worker, or on a thread of its own when
    none is idle; ``stop(timeout)`` hands the queued tasks to ``drop`` and waits for the
    workers (at most ``timeout`` seconds in all)."""

    def __init__(
        self,
        size: int,
        run: Callable[[T], None],
        drop: Callable[[T], None],
        name: str = "pycnid-worker",
    ) -> None:
        if size < 1:
            raise ValueError("a worker pool needs at least one worker")
        self._run = run
        self._drop = drop
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._tasks: deque[T] = deque()
        self._idle = 0
        self._stopping = False
        self._overflow = 0
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def size(self) -> int:
        return len(self._threads)

    @property
    def overflow_count(self) -> int:
        """How many tasks ran on a thread of their own because every worker was busy."""
        return self._overflow

    def submit(self, task: T) -> None:
        with self._cond:
            if self._stopping:
                pooled = None
            elif self._idle > len(self._tasks):  # a waiting worker will take it
                self._tasks.append(task)
                self._cond.notify()
                return
            else:
                pooled = False
                self._overflow += 1
        if pooled is None:
            self._drop(task)
            return
        threading.Thread(
            target=self._run_one, args=(task,), name=f"{self._name}-extra", daemon=True
        ).start()

    def stop(self, timeout: float = 2.0) -> None:
        with self._cond:
            self._stopping = True
            dropped = list(self._tasks)
            self._tasks.clear()
            self._cond.notify_all()
        for task in dropped:
            self._drop(task)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                while not self._tasks and not self._stopping:
                    self._cond.wait()
                self._idle -= 1
                if not self._tasks:
                    return
                task = self._tasks.popleft()
            self._run_one(task)

    def _run_one(self, task: T) -> None:
        try:
            self._run(task)
        except Exception:  # never lose a worker to one bad request
            log.exception("worker failed on a request")

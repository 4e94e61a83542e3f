"""Group commit: concurrent callers on one node share one store txn (flat combining).

A caller queues its *job* (``job(plan) -> value``: add this caller's reads and writes to the
plan) and, when no other caller is leading, leads: it plans every queued job
into one ``Plan`` (a job that raises is left out whole and gets its error), commits it in one
txn, and hands each job its value. When the txn loses a compare, the leader lets the caller
refresh the cache and plans the same jobs again (bounded attempts, jittered backoff). A caller
whose job a leader finished returns at once, without waiting for the next txn: each job has
an event of its own, set when it is finished or when leadership passes to it (a leader that is
done hands over to the oldest queued job), so no caller is woken for another's job. Only one
leader runs at a time, so the cache is never used by two threads at once.

With one caller at a time this is exactly "plan, commit, retry" under a lock; with many it
turns N round trips into one, which is what keeps a node fast when kubelet starts many pods.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from cni.spec.errors import TryAgainLater
from ipam.alloc.plan import MAX_TXN_OPS, Plan
from store.cas import LOST, Lost, Retry, run_cas

T = TypeVar("T")
BACKOFF_CAP = 0.05
FIRST_PAUSE = 0.004  # the second retry's (the first retry is at once)


@dataclass(eq=False)  # jobs are compared by identity (queue.remove)
class Job(Generic[T]):
    plan: Callable[[Plan], T]
    what: str
    done: bool = False
    value: Any = None
    error: BaseException | None = None
    wake: threading.Event = field(default_factory=threading.Event)  # finished, or now leading

    def finish(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error, self.done = value, error, True
        self.wake.set()


@dataclass
class Combiner:
    """``commit(plan) -> bool`` runs the txn (and updates the cache); ``refresh(plan)`` re-reads
    what a lost txn compared; ``on_retry()`` counts each further attempt, ``on_conflict()``
    each lost txn."""

    commit: Callable[[Plan], bool]
    refresh: Callable[[Plan], None]
    attempts: int = 16
    max_batch: int = 16
    store_name: str = "the store"
    on_retry: Callable[[], None] = lambda: None
    on_conflict: Callable[[], None] = lambda: None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _queue: deque = field(default_factory=deque)
    _leading: bool = False
    retry: Retry = field(init=False)

    def __post_init__(self) -> None:
        self.retry = Retry(
            self.attempts, base=FIRST_PAUSE, cap=BACKOFF_CAP, jitter=True, immediate=1
        )

    def run(self, plan: Callable[[Plan], T], what: str = "request") -> T:
        job: Job[T] = Job(plan, what)
        with self._lock:
            self._queue.append(job)
            leading = not self._leading
            self._leading = True
        if not leading:
            job.wake.wait()  # a leader finished it, or handed leadership to it
            leading = not job.done
        if leading:
            try:
                while not job.done:  # its job is queued until a batch of this leader takes it
                    with self._lock:
                        batch = [
                            self._queue.popleft()
                            for _ in range(min(len(self._queue), self.max_batch))
                        ]
                    self._lead(batch)
            finally:
                self._hand_over(job)
        if job.error is not None:
            raise job.error
        return job.value

    def _hand_over(self, own: Job) -> None:
        """The oldest queued job leads next; with none queued nobody leads. A leader leaving
        on an exception first takes its own job out of the queue (nobody waits for it)."""
        with self._lock:
            if not own.done and own in self._queue:
                self._queue.remove(own)
            if self._queue:
                self._queue[0].wake.set()
            else:
                self._leading = False

    def _lead(self, batch: list[Job]) -> None:
        try:
            self._serve(batch)
        except BaseException as exc:  # the store failed: every job of the batch hears it
            for job in batch:
                if not job.done:
                    job.finish(error=exc)

    def _serve(self, batch: list[Job]) -> None:
        run_cas(
            lambda: self._attempt(batch),
            self.retry,
            lambda: self._give_up(batch),
            on_conflict=self.on_conflict,
            on_retry=self.on_retry,
        )

    def _attempt(self, batch: list[Job]) -> bool | Lost:
        plan, planned = self._plan(batch)
        if plan.empty or self.commit(plan):
            for job, value in planned:
                job.finish(value)
            return True
        self.refresh(plan)
        return LOST

    def _give_up(self, batch: list[Job]) -> bool:
        for job in batch:
            if not job.done:
                job.finish(
                    error=TryAgainLater(
                        f"could not commit the {job.what} after {self.attempts} attempts",
                        f"{self.store_name} is contended; retry",
                    )
                )
        return False

    def _plan(self, batch: list[Job]) -> tuple[Plan, list[tuple[Job, Any]]]:
        """Every job that is not finished, planned into one txn; a job whose part would not
        fit goes back to the front of the queue for the next leader."""
        plan = Plan()
        planned: list[tuple[Job, Any]] = []
        for job in list(batch):
            if job.done:
                continue
            draft = plan.fork()
            try:
                value = job.plan(draft)
            except Exception as exc:  # noqa: BLE001 - the job's own failure, handed to it
                job.finish(error=exc)
                continue
            if planned and draft.size() > MAX_TXN_OPS:
                with self._lock:
                    self._queue.appendleft(job)
                batch.remove(job)
                continue
            plan = draft
            planned.append((job, value))
        return plan, planned

"""The dispatcher's concurrency rules, without a daemon: same attachment serialised, GC alone."""

from __future__ import annotations

import threading
import time

from pycnid.dispatch import AttachmentLocks


def run_threads(targets) -> None:
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)


def test_same_attachment_is_serialised_and_others_overlap() -> None:
    locks = AttachmentLocks()
    inside: dict[tuple, int] = {}
    peak: dict[tuple, int] = {}
    overall = {"now": 0, "peak": 0}
    guard = threading.Lock()

    def work(key):
        with locks.attachment(key):
            with guard:
                inside[key] = inside.get(key, 0) + 1
                peak[key] = max(peak.get(key, 0), inside[key])
                overall["now"] += 1
                overall["peak"] = max(overall["peak"], overall["now"])
            time.sleep(0.02)
            with guard:
                inside[key] -= 1
                overall["now"] -= 1

    keys = [("c1", "eth0")] * 5 + [("c2", "eth0")] * 5 + [("c1", "net1")] * 5
    run_threads([lambda k=k: work(k) for k in keys])
    assert peak == {("c1", "eth0"): 1, ("c2", "eth0"): 1, ("c1", "net1"): 1}
    assert overall["peak"] >= 2  # different attachments ran at the same time
    assert locks._locks == {}  # no lock entry is leaked


def test_gc_runs_alone() -> None:
    locks = AttachmentLocks()
    events: list[str] = []
    started = threading.Event()

    def add():
        with locks.attachment(("c", "eth0")):
            started.set()
            events.append("add-start")
            time.sleep(0.1)
            events.append("add-end")

    def gc():
        started.wait(5)
        with locks.exclusive():
            events.append("gc-start")
            time.sleep(0.05)
            events.append("gc-end")

    def late_add():
        started.wait(5)
        time.sleep(0.03)
        with locks.attachment(("d", "eth0")):
            events.append("late")

    run_threads([add, gc, late_add])
    gc_start, gc_end = events.index("gc-start"), events.index("gc-end")
    assert events.index("add-end") < gc_start
    assert gc_end == gc_start + 1

"""Pod churn on overlay nodes, as a runtime makes it: on every node at once, an ADD of a new Pod
through the pycni-bridge executable every ``interval`` seconds and, every other time, a DEL of
the oldest Pod the churn added there. Every call is kept (``Call``: node, container ID, command,
the executable's answer, how long it took) with the test's phase when it started, so a test can
ask which failed and with what code, which Pods are live, and retry a failed ADD with the same
container ID and namespace.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from tests.cluster.load import Call
from tests.fixtures.bridge import new_cid
from tests.fixtures.cluster import ClusterNode, Host
from tests.fixtures.netns import Netns, new_netns

from .pods import OverlayCluster, pod_conf


@dataclass
class Churn:
    cluster: OverlayCluster
    interval: float = 0.5
    phase: str = ""  # what the test is doing now, kept with each call
    log: list[tuple[str, Call]] = field(default_factory=list)
    netns: dict[str, tuple[ClusterNode, Netns]] = field(default_factory=dict)  # cid ->
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def call(self, node: ClusterNode, command: str, cid: str) -> Call:
        """One pycni-bridge call for the churn's Pod ``cid`` on ``node``, kept."""
        ns, phase = self.netns[cid][1], self.phase
        started = time.monotonic()
        run = self.cluster.runner(node).run(command, pod_conf(), cid, ns.path)
        call = Call(node.name, cid, command, run, time.monotonic() - started)
        self.log.append((phase, call))
        return call

    def add(self, node: ClusterNode) -> Call:
        """ADD of a new Pod (a new namespace, removed with the underlay)."""
        ns = new_netns(f"{node.name}c")
        self.cluster.cluster.underlay.hosts.append(Host(ns, ""))
        cid = new_cid()
        self.netns[cid] = (node, ns)
        return self.call(node, "ADD", cid)

    def start(self) -> Churn:
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self.run_on, args=(node,), name=f"churn-{node.name}")
            for node in self.cluster.nodes
        ]
        for thread in self._threads:
            thread.start()
        return self

    def run_on(self, node: ClusterNode) -> None:
        mine: list[str] = []  # this thread's Pods that are up, oldest first
        turn = 0
        while not self._stop.is_set():
            added = self.add(node)
            if added.ok:
                mine.append(added.cid)
            turn += 1
            if turn % 2 == 0 and mine and self.call(node, "DEL", mine[0]).ok:
                mine.pop(0)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    @property
    def calls(self) -> list[Call]:
        return [call for _, call in self.log]

    def failed(self) -> list[Call]:
        return [c for c in self.calls if not c.ok]

    def live(self) -> list[Call]:
        """The last successful ADD of every Pod no DEL was tried for since: a Pod whose DEL
        failed is being torn down (the runtime repeats the DEL: ``follow_failed_dels``), and
        a DEL cut half-way may have removed its veth or its lease already."""
        last: dict[str, Call] = {}
        for call in self.calls:
            if call.ok or call.command == "DEL":
                last[call.cid] = call
        return [c for c in last.values() if c.command == "ADD" and c.ok]

    def follow_failed_dels(self) -> list[Call]:
        """DEL again for each Pod whose last call was a failed DEL (the runtime repeats a
        sandbox's teardown until it succeeds; the churn stopped before it did); the calls."""
        last = {call.cid: call for call in self.calls}
        return [
            self.call(self.netns[c.cid][0], "DEL", c.cid)
            for c in last.values()
            if c.command == "DEL" and not c.ok
        ]

    def pods(self, ok: bool = False) -> int:
        """How many Pods the churn added (``ok``: of them, those an ADD succeeded for)."""
        return len({c.cid for c in self.calls if c.command == "ADD" and (c.ok or not ok)})

    def retry_failed_adds(self) -> list[Call]:
        """Each ADD that failed, again with its container ID and namespace (the runtime's
        retry); the retries' calls."""
        return self.follow_failed_adds("ADD")

    def follow_failed_adds(self, command: str) -> list[Call]:
        """``command`` (ADD: the runtime's retry; DEL: its teardown) for each Pod whose ADD
        failed and that no call since succeeded for, with its container ID and namespace;
        the calls."""
        done = {c.cid for c in self.calls if c.ok}
        return [
            self.call(self.netns[c.cid][0], command, c.cid)
            for c in self.failed()
            if c.command == "ADD" and c.cid not in done
        ]

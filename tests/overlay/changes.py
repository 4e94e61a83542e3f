"""Changes an operator makes through `pycni` while the store may be away, and when each node's
kernel shows them.

``Attempts`` runs one command again and again (on its own thread) until it is accepted, keeping
every attempt, as an operator or a controller retrying would. A command that is not idempotent
(`pycni svc create`) may land in etcd while its reply is lost as etcd comes back; the next
attempt is then refused for what the store already holds: ``landed``, a read of the change,
says so, and its output stands for the lost reply. ``first_seen`` polls every node at once for
a change and says when each first showed it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tests.fixtures.cluster import ClusterNode
from tests.fixtures.waiting import wait_for

from .pods import pycni_cli


@dataclass(frozen=True)
class Attempt:
    started: float  # monotonic seconds
    ended: float
    code: int  # the command's exit status
    stderr: str


@dataclass
class Attempts:
    """`pycni ARGV` on ``node`` every ``pause`` s until it exits 0 or ``give_up`` s passed."""

    node: ClusterNode
    argv: tuple[str, ...]
    landed: tuple[str, ...] = ()  # `pycni` args that succeed once the change is in the store
    pause: float = 0.2
    give_up: float = 120.0
    tried: list[Attempt] = field(default_factory=list)
    stdout: str = ""  # the accepted attempt's (or ``landed``'s)
    refused_as_landed: Attempt | None = None  # the attempt refused for what had landed
    thread: threading.Thread | None = None

    def start(self) -> Attempts:
        self.thread = threading.Thread(target=self.run, name=f"pycni {' '.join(self.argv[:2])}")
        self.thread.start()
        return self

    def run(self) -> None:
        deadline = time.monotonic() + self.give_up
        while time.monotonic() < deadline:
            started = time.monotonic()
            out = pycni_cli(self.node, *self.argv)
            self.tried.append(Attempt(started, time.monotonic(), out.returncode, out.stderr))
            if out.returncode == 0:
                self.stdout = out.stdout
                return
            if self.landed and "etcd" not in out.stderr and self.read_landed():
                return
            time.sleep(self.pause)

    def read_landed(self) -> bool:
        shown = pycni_cli(self.node, *self.landed)
        if shown.returncode == 0:
            self.stdout, self.refused_as_landed = shown.stdout, self.tried[-1]
        return shown.returncode == 0

    def wait(self) -> str:
        """The accepted attempt's output (fails the test if none was)."""
        assert self.thread is not None
        self.thread.join()
        assert self.stdout, f"`pycni {' '.join(self.argv)}` never accepted: {self.tried[-1:]}"
        return self.stdout

    @property
    def accepted(self) -> float:
        return self.tried[-1].ended

    def refused(self) -> list[Attempt]:
        """The attempts refused (not the one refused for what had landed)."""
        return [a for a in self.tried if a.code != 0 and a is not self.refused_as_landed]


def first_seen(
    nodes: list[ClusterNode], shows: Callable[[ClusterNode], bool], timeout: float = 60.0
) -> dict[str, float]:
    """node name -> when (monotonic) its kernel first showed the change, every node polled
    on its own thread every 50 ms."""

    def watch(node: ClusterNode) -> float:
        wait_for(f"the change in {node.name}'s kernel", lambda: shows(node), timeout, 0.05)
        return time.monotonic()

    with ThreadPoolExecutor(len(nodes)) as pool:
        return dict(zip((n.name for n in nodes), pool.map(watch, nodes), strict=True))

"""Traffic that runs for a whole drill: a TCP echo server in a Pod, and probers that open a new
connection every ``interval`` seconds from one Pod to an address (a Pod IP or a Service VIP) and
log each attempt as ``<monotonic start> <1|0>``.

A new connection per probe meets everything a new flow meets (the Service proxy's DNAT, the
NetworkPolicy chains: an established flow skips both), so a probe that fails is traffic the
dataplane lost or refused at that moment. ``CLOCK_MONOTONIC`` is one clock for every network
namespace, so the probes' times compare with the test's own ``time.monotonic()``.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass, field

from tests.fixtures.netns import Netns

from .pods import python_in

ECHO_SERVER = """
import socket, sys, threading
def echo(c):
    with c:
        while (d := c.recv(4096)):
            c.sendall(d)
def serve(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(512)
    while True:
        c, _ = s.accept(); threading.Thread(target=echo, args=(c,), daemon=True).start()
for port in sys.argv[1:]:
    threading.Thread(target=serve, args=(int(port),), daemon=True).start()
threading.Event().wait()
"""
PROBER = """
import os, socket, sys, time
ip, port, stop = sys.argv[1], int(sys.argv[2]), sys.argv[5]
interval, timeout = float(sys.argv[3]), float(sys.argv[4])
while not os.path.exists(stop):
    started = time.monotonic()
    try:
        with socket.create_connection((ip, port), timeout=timeout) as s:
            s.sendall(b"x"); ok = s.recv(1) == b"x"
    except OSError:
        ok = False
    print(f"{started:.3f} {int(ok)}", flush=True)
    time.sleep(max(0.0, started + interval - time.monotonic()))
"""


ONCE = """
import socket, sys
ip, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
try:
    with socket.create_connection((ip, port), timeout=timeout) as s:
        s.sendall(b"x"); print(int(s.recv(1) == b"x"))
except OSError:
    print(0)
"""


def reaches(ns: Netns, ip: str, port: int, timeout: float = 1.0) -> bool:
    """Whether one new connection from ``ns`` to ``ip``:``port`` is answered."""
    argv = python_in(ns, ONCE) + [ip, str(port), str(timeout)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 30)
    return out.stdout.strip() == "1"


def serve_echo(ns: Netns, *ports: int) -> subprocess.Popen:
    """A TCP echo server on every one of ``ports`` in the Pod (the caller stops it)."""
    return subprocess.Popen(python_in(ns, ECHO_SERVER) + [str(p) for p in ports])


@dataclass
class Prober:
    """Connections from ``ns`` to ``ip``:``port`` every ``interval`` s until ``stop()``."""

    kind: str
    ns: Netns
    ip: str
    port: int
    interval: float = 0.1
    timeout: float = 2.0
    workdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="prober"))
    proc: subprocess.Popen | None = None

    @property
    def log(self) -> str:
        return os.path.join(self.workdir, "log")

    def start(self) -> Prober:
        argv = [self.ip, str(self.port), str(self.interval), str(self.timeout)]
        with open(self.log, "w") as out:
            script = python_in(self.ns, PROBER) + [*argv, os.path.join(self.workdir, "stop")]
            self.proc = subprocess.Popen(script, stdout=out)
        return self

    def attempts(self) -> list[tuple[float, bool]]:
        """Every attempt logged so far: (when it started, whether it was answered)."""
        with open(self.log) as fh:
            rows = [line.split() for line in fh if line.endswith("\n")]
        return [(float(t), ok == "1") for t, ok in rows]

    def stop(self) -> None:
        if self.proc is None:
            return
        open(os.path.join(self.workdir, "stop"), "w").close()
        try:
            self.proc.wait(self.timeout + self.interval + 5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass(frozen=True)
class Window:
    """What a prober saw between ``start`` and ``end`` (monotonic seconds)."""

    start: float
    end: float
    tried: int
    answered: int

    @property
    def lost(self) -> int:
        return self.tried - self.answered

    @property
    def lost_per_second(self) -> float:
        return self.lost / max(self.end - self.start, 1e-9)


def calc_window(attempts: list[tuple[float, bool]], start: float, end: float) -> Window:
    """The attempts that started in [start, end)."""
    inside = [ok for t, ok in attempts if start <= t < end]
    return Window(start, end, len(inside), sum(inside))

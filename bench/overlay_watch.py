"""Independent observers for the convergence benchmark: no pycni code reads what is measured.

``RegistryWatch``: an etcd watch of the node records through etcd's own v3 HTTP gateway
(streamed, from a thread inside the control-plane namespace); each event is stamped with the
wall clock when it arrives — "the registry write" of a join or a leave.

``KernelWatch``: ``ip -tshort monitor route neigh`` in one node namespace (iproute2 stamps
each notification itself, so a busy reader thread adds nothing); routes, neighbours and FDB
entries (vxlan FDB entries arrive as bridge-family neighbours: ``<underlay> dev <vxlan>
lladdr <mac>``). Event-driven, so 20 observers cost nothing while the kernel is quiet.

``Pinger``: the first echo reply across the overlay, from a Pod's namespace.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from kernel.ns import entered


@dataclass(frozen=True)
class KernelEvent:
    at: float  # wall clock (seconds since the epoch), stamped by iproute2
    deleted: bool
    text: str  # the notification without its stamp and "Deleted "


def parse_monitor_line(line: str) -> KernelEvent | None:
    """``[2026-12-01T11:30:06.945678] Deleted 10.1.0.5 dev vx0 ...`` -> KernelEvent."""
    if not line.startswith("[") or "] " not in line:
        return None
    stamp, _, rest = line.partition("] ")
    try:
        at = datetime.strptime(stamp[1:], "%Y-%m-%dT%H:%M:%S.%f").timestamp()
    except ValueError:
        return None
    deleted = rest.startswith("Deleted ")
    return KernelEvent(at, deleted, rest[len("Deleted ") :].strip() if deleted else rest.strip())


class KernelWatch:
    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.events: list[KernelEvent] = []
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            ["ip", "-n", ns, "-tshort", "monitor", "route", "neigh"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.thread = threading.Thread(target=self.read, name=f"monitor-{ns}", daemon=True)
        self.thread.start()

    def read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = parse_monitor_line(line)
            if event is not None:
                with self.lock:
                    self.events.append(event)

    def first(self, since: float, deleted: bool, *needles: str) -> float | None:
        """Stamp of the first event after ``since`` whose text holds every needle."""
        with self.lock:
            for event in self.events:
                if (
                    event.at >= since
                    and event.deleted == deleted
                    and all(n in event.text for n in needles)
                ):
                    return event.at
        return None

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@dataclass(frozen=True)
class RegistryEvent:
    at: float  # wall clock when the watch delivered it
    kind: str  # "PUT" | "DELETE"
    key: str
    value: dict


class RegistryWatch:
    """Node-record events from etcd (``host:port`` of a member, inside ``netns``)."""

    def __init__(self, netns: str, host: str, port: int, prefix: str) -> None:
        self.events: list[RegistryEvent] = []
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.args = (netns, host, port, prefix)
        self.conn: http.client.HTTPConnection | None = None
        threading.Thread(target=self.run, name="registry-watch", daemon=True).start()
        if not self.ready.wait(10):
            raise RuntimeError("the etcd watch did not start")

    def run(self) -> None:
        netns, host, port, prefix = self.args
        fd = os.open(f"/var/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            with entered(fd):
                self.stream(host, port, prefix)
        except (OSError, http.client.HTTPException, ValueError):
            pass  # closed by close(), or etcd went away with the cluster
        finally:
            os.close(fd)

    def stream(self, host: str, port: int, prefix: str) -> None:
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        body = {"create_request": {"key": b64(prefix), "range_end": b64(end)}}
        self.conn = http.client.HTTPConnection(host, port)
        self.conn.request("POST", "/v3/watch", body=json.dumps(body))
        response = self.conn.getresponse()
        while line := response.readline():
            self.ready.set()
            at = time.time()
            for event in json.loads(line).get("result", {}).get("events") or []:
                self.add(at, event)

    def add(self, at: float, event: dict) -> None:
        kv = event.get("kv", {})
        raw = base64.b64decode(kv.get("value", "")) if kv.get("value") else b""
        value = json.loads(raw) if raw else {}
        with self.lock:
            self.events.append(
                RegistryEvent(
                    at, event.get("type", "PUT"), base64.b64decode(kv["key"]).decode(), value
                )
            )

    def first(
        self, since: float, key: str, kind: str, need_overlay: bool = False
    ) -> RegistryEvent | None:
        with self.lock:
            for event in self.events:
                if (
                    event.at >= since
                    and event.key == key
                    and event.kind == kind
                    and (not need_overlay or "overlay" in event.value)
                ):
                    return event
        return None

    def close(self) -> None:
        if self.conn is not None and self.conn.sock is not None:
            self.conn.sock.shutdown(2)


class Pinger:
    """ICMP echo requests every ``interval`` seconds from inside ``netns`` until the first
    reply; ``first`` is its wall-clock time (None: none within ``timeout``). A raw socket of
    its own, not iputils ping: that one slows down after ICMP errors (no route yet)."""

    def __init__(self, netns: str, target: str, timeout: float, interval: float = 0.005):
        self.first: float | None = None
        self.args = (netns, target, timeout, interval)
        self.thread = threading.Thread(target=self.run, name="pinger", daemon=True)
        self.thread.start()

    def run(self) -> None:
        netns, target, timeout, interval = self.args
        fd = os.open(f"/var/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            with entered(fd):
                sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        finally:
            os.close(fd)
        with sock:
            sock.settimeout(interval)
            self.first = echo_until_reply(sock, target, timeout, interval)

    def wait(self) -> float | None:
        self.thread.join()
        return self.first


def echo_until_reply(
    sock: socket.socket, target: str, timeout: float, interval: float
) -> float | None:
    ident = os.getpid() & 0xFFFF
    deadline = time.monotonic() + timeout
    seq = 0
    while time.monotonic() < deadline:
        seq = (seq + 1) & 0xFFFF
        try:
            sock.sendto(echo_request(ident, seq), (target, 0))
        except OSError:
            pass  # no route yet on this side: keep trying
        stop = time.monotonic() + interval
        while (left := stop - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                data = sock.recv(2048)
            except (TimeoutError, OSError):
                break
            at = time.time()
            icmp = data[(data[0] & 0x0F) * 4 :]
            if icmp[:1] == b"\x00" and struct.unpack("!H", icmp[4:6])[0] == ident:
                return at
    return None


def echo_request(ident: int, seq: int) -> bytes:
    body = struct.pack("!BBHHH", 8, 0, 0, ident, seq) + b"pycni-bench"
    return body[:2] + struct.pack("!H", inet_checksum(body)) + body[4:]


def inet_checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()

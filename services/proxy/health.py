"""healthCheckNodePort: pycnid answers cloud load balancers' health checks, as kube-proxy does.

A Service with externalTrafficPolicy Local on a NodePort or LoadBalancer has a
healthCheckNodePort (``services/allocate.py``). A load balancer in front of the nodes sends
its traffic only to nodes whose health check passes, so that a node without a local endpoint
(whose NodePort drops that traffic) is taken out. pycnid serves HTTP on that port, one small
threaded server per port and address: on every address of the node (kube-proxy's default),
or, when the proxy's ``nodePortAddresses`` narrows where NodePorts answer, on exactly those
addresses (as kube-proxy binds them). Any path, ``GET /healthz`` included, answers

    {"service": {"namespace": "default", "name": "web"}, "localEndpoints": 1,
     "serviceProxyHealthy": true}

with 200 while the node has a ready endpoint of the Service (a Pod attachment that serves one
of its ports) and the proxy is healthy, 503 otherwise (a terminating endpoint does not count:
the node is drained from the load balancer while its connections finish). The proxy is
unhealthy once the kernel has refused its passes for ``ProxyHealth.timeout`` (twice the resync
interval, kube-proxy's relation of its health timeout to its sync period): its table no longer
follows the Services, so a load balancer should stop trusting this node. The proxy's sync
hands ``HealthServers`` the target of every Service its pass touched (``calc_health``) and
where to bind; servers start and stop as Services come and go, and one whose port could not
be bound is tried again next pass.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from services.proxy.view import Records
from services.selectors import calc_served_ports

log = logging.getLogger("pycnid.proxy")


@dataclass(frozen=True)
class HealthTarget:
    """What one healthCheckNodePort answers for: its Service, this node's ready endpoints."""

    port: int
    namespace: str
    name: str
    local_endpoints: int


def calc_health(records: Records, key: str, node: str) -> HealthTarget | None:
    """The health target of Service ``key`` on ``node`` (None: gone, or it has no
    healthCheckNodePort)."""
    record = records.services.get(key)
    if record is None or not record.wants_health_check or not record.health_check_node_port:
        return None
    count = sum(
        1
        for e, _ in records.selected(record)
        if e.node == node and e.ready and calc_served_ports(record, e)
    )
    return HealthTarget(record.health_check_node_port, record.namespace, record.name, count)


class ProxyHealth:
    """Whether the proxy keeps its table: unhealthy once its passes have been refused for
    ``timeout`` seconds in a row (``note_pass``), healthy again at the next applied pass."""

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout, self.clock = timeout, clock
        self.failing_since: float | None = None

    def note_pass(self, applied: bool) -> None:
        if applied:
            self.failing_since = None
        elif self.failing_since is None:
            self.failing_since = self.clock()

    def is_healthy(self) -> bool:
        since = self.failing_since
        return since is None or self.clock() - since < self.timeout


def render_health(target: HealthTarget, healthy: bool = True) -> tuple[int, bytes]:
    """The status and JSON body kube-proxy's health check server answers: 200 with local
    endpoints and a healthy proxy, else 503."""
    body = {
        "service": {"namespace": target.namespace, "name": target.name},
        "localEndpoints": target.local_endpoints,
        "serviceProxyHealthy": healthy,
    }
    status = 200 if target.local_endpoints > 0 and healthy else 503
    return status, json.dumps(body).encode()


class HealthServer(Protocol):
    target: HealthTarget

    def close(self) -> None: ...


class HttpHealthServer(ThreadingHTTPServer):
    """One port's server on one address ("": every address): a daemon thread answering from
    the current ``target`` and the proxy's ``health``."""

    daemon_threads = True
    address_family = socket.AF_INET6

    def __init__(self, target: HealthTarget, address: str, health: ProxyHealth) -> None:
        self.target, self.health = target, health
        if address and ipaddress.ip_address(address).version == 4:
            self.address_family = socket.AF_INET
        try:
            super().__init__((address or "::", target.port), HealthHandler)  # "::": IPv4 too
        except OSError as exc:
            if address or exc.errno != getattr(socket, "EAFNOSUPPORT", 97):
                raise
            self.address_family = socket.AF_INET  # a node without IPv6
            super().__init__(("0.0.0.0", target.port), HealthHandler)
        self.thread = threading.Thread(
            target=self.serve_forever, name=f"healthz-{target.port}", daemon=True
        )
        self.thread.start()

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6 and self.server_address[0] == "::":
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(timeout=5)


class HealthHandler(BaseHTTPRequestHandler):
    server: HttpHealthServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        status, body = render_health(self.server.target, self.server.health.is_healthy())
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header(
            "X-Load-Balancing-Endpoint-Weight", str(self.server.target.local_endpoints)
        )
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return None  # a load balancer asks every few seconds: nothing to log


EVERY_ADDRESS = ("",)
Start = Callable[[HealthTarget, str], HealthServer]


class HealthServers:
    """Servers by port and address, following the targets a sync hands in and where to bind
    them (``apply``). ``start`` makes one (``HttpHealthServer``; a test's fake)."""

    def __init__(self, health: ProxyHealth, start: Start | None = None) -> None:
        self.health = health
        self.start: Start = start or (lambda t, a: HttpHealthServer(t, a, health))
        self.binds: tuple[str, ...] = EVERY_ADDRESS
        self.wanted: dict[str, HealthTarget] = {}  # Service key -> its target
        self.running: dict[tuple[int, str], HealthServer] = {}  # (port, address) -> server
        self.lock = threading.Lock()

    def apply(
        self, targets: Mapping[str, HealthTarget | None], binds: tuple[str, ...] | None = None
    ) -> None:
        """Take the targets of the Services a pass touched (None: none any more) and the
        addresses to bind (None: as before; ``EVERY_ADDRESS``), stop the servers no target
        wants, start or retarget the rest (each pass: a port that could not be bound is
        tried again)."""
        with self.lock:
            for key, target in targets.items():
                if target is None:
                    self.wanted.pop(key, None)
                else:
                    self.wanted[key] = target
            if binds is not None:
                self.binds = binds
            self._ensure()

    def _ensure(self) -> None:
        by_port = {t.port: t for t in self.wanted.values()}
        wanted = {(port, address) for port in by_port for address in self.binds}
        for key in [k for k in self.running if k not in wanted]:
            self.running.pop(key).close()
        for port, address in sorted(wanted):
            target = by_port[port]
            server = self.running.get((port, address))
            if server is not None:
                server.target = target
                continue
            try:
                self.running[(port, address)] = self.start(target, address)
            except OSError as exc:  # in use by something else: tried again next pass
                log.warning(
                    "proxy: healthCheckNodePort %d on %s of %s/%s: %s",
                    port,
                    address or "every address",
                    target.namespace,
                    target.name,
                    exc,
                )

    def stop(self) -> None:
        with self.lock:
            self.wanted.clear()
            self._ensure()

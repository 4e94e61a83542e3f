"""healthCheckNodePort: pycnid answers cloud load balancers' health checks, as kube-proxy does.

A Service with externalTrafficPolicy Local on a NodePort or LoadBalancer has a
healthCheckNodePort (``services/allocate.py``). A load balancer in front of the nodes sends
its traffic only to nodes whose health check passes, so that a node without a local endpoint
(whose NodePort drops that traffic) is taken out. pycnid serves HTTP on that port, bound on
every address of the node (kube-proxy's default), one small threaded server per port: any
path, ``GET /healthz`` included, answers

    {"service": {"namespace": "default", "name": "web"}, "localEndpoints": 1,
     "serviceProxyHealthy": true}

with 200 while the node has a ready endpoint of the Service (a Pod attachment that serves one
of its ports), 503 without (a terminating endpoint does not count: the node is drained from
the load balancer while its connections finish). The proxy's sync hands ``HealthServers`` the
target of every Service its pass touched (``calc_health``); servers start and stop as
Services come and go, and one whose port could not be bound is tried again next pass.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
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


def render_health(target: HealthTarget) -> tuple[int, bytes]:
    """The status and JSON body kube-proxy's health check server answers."""
    body = {
        "service": {"namespace": target.namespace, "name": target.name},
        "localEndpoints": target.local_endpoints,
        "serviceProxyHealthy": True,
    }
    return (200 if target.local_endpoints > 0 else 503), json.dumps(body).encode()


class HealthServer(Protocol):
    target: HealthTarget

    def close(self) -> None: ...


class HttpHealthServer(ThreadingHTTPServer):
    """One port's server: a daemon thread answering from the current ``target``."""

    daemon_threads = True
    address_family = socket.AF_INET6

    def __init__(self, target: HealthTarget) -> None:
        self.target = target
        try:
            super().__init__(("::", target.port), HealthHandler)  # IPv4 too (not V6ONLY)
        except OSError as exc:
            if exc.errno != getattr(socket, "EAFNOSUPPORT", 97):
                raise
            self.address_family = socket.AF_INET  # a node without IPv6
            super().__init__(("0.0.0.0", target.port), HealthHandler)
        self.thread = threading.Thread(
            target=self.serve_forever, name=f"healthz-{target.port}", daemon=True
        )
        self.thread.start()

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(timeout=5)


class HealthHandler(BaseHTTPRequestHandler):
    server: HttpHealthServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        status, body = render_health(self.server.target)
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


class HealthServers:
    """Servers by port, following the targets a sync hands in (``apply``). ``start`` makes
    one (``HttpHealthServer``; a test's fake)."""

    def __init__(self, start: Callable[[HealthTarget], HealthServer] = HttpHealthServer) -> None:
        self.start = start
        self.wanted: dict[str, HealthTarget] = {}  # Service key -> its target
        self.running: dict[int, HealthServer] = {}  # port -> its server
        self.lock = threading.Lock()

    def apply(self, targets: Mapping[str, HealthTarget | None]) -> None:
        """Take the targets of the Services a pass touched (None: none any more), stop the
        servers no target wants, start or retarget the rest (each pass: a port that could
        not be bound is tried again)."""
        with self.lock:
            for key, target in targets.items():
                if target is None:
                    self.wanted.pop(key, None)
                else:
                    self.wanted[key] = target
            self._ensure()

    def _ensure(self) -> None:
        by_port = {t.port: t for t in self.wanted.values()}
        for port in [p for p in self.running if p not in by_port]:
            self.running.pop(port).close()
        for port, target in sorted(by_port.items()):
            server = self.running.get(port)
            if server is not None:
                server.target = target
                continue
            try:
                self.running[port] = self.start(target)
            except OSError as exc:  # in use by something else: tried again next pass
                log.warning(
                    "proxy: healthCheckNodePort %d of %s/%s: %s",
                    port,
                    target.namespace,
                    target.name,
                    exc,
                )

    def stop(self) -> None:
        with self.lock:
            self.wanted.clear()
            self._ensure()

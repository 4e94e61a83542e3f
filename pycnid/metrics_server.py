"""pycnid's metrics endpoint: GET /metrics on a loopback address renders the registry."""

from __future__ import annotations

import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from common.metrics import Registry

log = logging.getLogger("pycnid.metrics")


class QuietHTTPServer(ThreadingHTTPServer):
    """Errors while serving a scrape become log lines, not tracebacks on stderr: a scraper
    that hangs up (timed out, restarted) is routine, a debug line; anything else is logged
    with its stack in the daemon's JSON log."""

    def handle_error(self, request, client_address) -> None:  # socketserver API
        exc = sys.exc_info()[1]
        peer = ":".join(map(str, client_address))
        if isinstance(exc, ConnectionError):  # BrokenPipe, ConnectionReset, ConnectionAborted
            log.debug("metrics scraper %s hung up: %s", peer, exc)
        else:
            log.error("serving metrics to %s failed", peer, exc_info=True)


class MetricsServer:
    """GET /metrics on a loopback address, in a daemon thread."""

    def __init__(self, registry: Registry, address: str) -> None:
        host, _, port = address.rpartition(":")
        registry_ref = registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = registry_ref.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args) -> None:
                pass

        self.httpd = QuietHTTPServer((host or "127.0.0.1", int(port)), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="metrics", daemon=True
        )

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self) -> MetricsServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

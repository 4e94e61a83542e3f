"""pycnid lifecycle: load config -> wire the store, the node's loops and plugins (wiring.py)
-> serve -> shut down on SIGTERM."""

from __future__ import annotations

import argparse
import ctypes
import logging
import signal
import sys
import threading
from dataclasses import replace
from typing import Any

from cni.spec.errors import CNIError
from common.metrics import Registry
from pycnid.config import DaemonConfig, SectionInvalid, load_daemon_config
from pycnid.dispatch import Dispatcher
from pycnid.logs import setup_logging
from pycnid.metrics_server import MetricsServer
from pycnid.server import PluginServer
from pycnid.wiring import Lifecycle, build_plugins, wire_node

log = logging.getLogger("pycnid")


class Daemon:
    """startup -> serve_forever -> shutdown, with SIGTERM/SIGINT captured."""

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.registry = Registry()
        self.life = Lifecycle(config.node_name, self.registry)
        self.server: PluginServer | None = None
        self.metrics_server: MetricsServer | None = None
        self._stopping = threading.Event()

    def startup(self) -> None:
        node = wire_node(self.config, self.life)  # the store and the node's loops
        plugins = build_plugins(node.deps, self.life)
        dispatcher = Dispatcher(plugins, self.registry)
        if self.config.metrics_address:
            self.metrics_server = MetricsServer(self.registry, self.config.metrics_address).start()
        self.server = PluginServer(
            self.config.socket, dispatcher.handle, self.config.workers, self.config.receive_timeout
        )
        log.info(
            "pycnid serving",
            extra={
                "fields": {
                    "socket": self.config.socket,
                    "node": self.config.node_name,
                    "store": self.config.store.type,
                    "plugins": sorted(plugins),
                }
            },
        )

    def serve(self) -> None:
        assert self.server is not None
        if self._stopping.is_set():  # SIGTERM came before self.server was set: nothing to shut
            return
        self.server.serve_forever(poll_interval=0.2)

    def request_stop(self, *_: Any) -> None:
        if not self._stopping.is_set():
            self._stopping.set()
            threading.Thread(
                target=self.server.shutdown if self.server else (lambda: None), daemon=True
            ).start()

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.server_close()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        self.life.shut_down()
        log.info("pycnid stopped")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pycnid", description="pycni node daemon")
    parser.add_argument(
        "--config", "-c", default=None, help="daemon config (JSON); default: built-in defaults"
    )
    parser.add_argument("--socket", default=None, help="override the socket path")
    parser.add_argument(
        "--node-name",
        default=None,
        help="override nodeName (a DaemonSet passes the Pod's spec.nodeName here)",
    )
    return parser.parse_args(argv)


def apply_overrides(config: DaemonConfig, args: argparse.Namespace) -> DaemonConfig:
    """The command line's ``--socket`` and ``--node-name`` over the config file's keys."""
    changes = {"socket": args.socket, "node_name": args.node_name}
    return replace(config, **{key: value for key, value in changes.items() if value})


M_ARENA_MAX = -8  # glibc's mallopt parameter
MALLOC_ARENAS = 2


def limit_malloc_arenas() -> None:
    """Before any thread starts: at most ``MALLOC_ARENAS`` glibc malloc arenas. glibc gives a
    thread that meets contention an arena of its own (up to 8 a core); pycnid's threads (the
    watches decode records, the proxy plans) then each kept freed memory in their own arena
    that malloc_trim gives back only in part. The GIL runs one thread at a time: two arenas
    are enough. Not glibc: nothing to do."""
    try:
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, MALLOC_ARENAS)
    except (OSError, AttributeError):
        pass


def run(config: DaemonConfig) -> int:
    limit_malloc_arenas()
    setup_logging(config.log_level)
    daemon = Daemon(config)
    signal.signal(signal.SIGTERM, daemon.request_stop)
    signal.signal(signal.SIGINT, daemon.request_stop)
    try:
        daemon.startup()
    except (CNIError, RuntimeError, OSError) as exc:
        log.error("pycnid failed to start: %s", exc)
        daemon.shutdown()
        return 1
    try:
        daemon.serve()
    finally:
        daemon.shutdown()
    return 0


def report_failed_start(exc: SectionInvalid) -> int:
    """A bad section is a failed start (logged, exit 1), as in ``run``; pycnid's own keys are
    not (``main``: exit 2)."""
    setup_logging(exc.log_level)
    log.error("pycnid failed to start: %s", exc)
    log.info("pycnid stopped")
    return 1


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        config = load_daemon_config(args.config)
    except SectionInvalid as exc:
        sys.exit(report_failed_start(exc))
    except CNIError as exc:
        sys.stderr.write(f"pycnid: {exc}\n")
        sys.exit(2)
    sys.exit(run(apply_overrides(config, args)))


if __name__ == "__main__":
    main()

"""pycnid lifecycle: load config -> build services and plugins -> serve -> shut down on SIGTERM."""
from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
import threading
from typing import Any

from cni.plugins.base import Faults, Services
from cni.spec.errors import CNIError
from .config import DaemonConfig, load_daemon_config
from .dispatch import Dispatcher
from .logs import setup_logging
from .metrics import MetricsServer
from .server import PluginServer

log = logging.getLogger("pycnid")

# plugin name (as the executable sends it) -> module with `create(services, config)`
PLUGIN_MODULES = {"bridge": "cni.plugins.bridge", "ipam": "cni.plugins.ipam", "svc": "cni.plugins.svc"}


def build_plugins(services: Services, config: DaemonConfig) -> dict[str, Any]:
    """Create each plugin handler; IPAM first, since the bridge delegates to it in-process."""
    for name in ("ipam", "bridge", "svc"):
        try:
            module = importlib.import_module(PLUGIN_MODULES[name])
        except ModuleNotFoundError as exc:
            if exc.name != PLUGIN_MODULES[name]:
                raise
            log.info("plugin %s not available in this build", name)
            continue
        services.plugins[name] = module.create(services, config)
    return services.plugins


class Daemon:
    """startup -> serve_forever -> shutdown, with SIGTERM/SIGINT captured."""

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.services = Services(node_name=config.node_name, faults=Faults(config.fault_injection))
        self.server: PluginServer | None = None
        self.metrics_server: MetricsServer | None = None
        self._stopping = threading.Event()

    def startup(self) -> None:
        plugins = build_plugins(self.services, self.config)
        dispatcher = Dispatcher(plugins, self.services.metrics)
        if self.config.metrics_address:
            self.metrics_server = MetricsServer(self.services.metrics,
                                                self.config.metrics_address).start()
        self.server = PluginServer(self.config.socket, dispatcher.handle, self.config.workers,
                                   self.config.receive_timeout)
        log.info("pycnid serving", extra={"fields": {
            "socket": self.config.socket, "node": self.config.node_name,
            "store": self.config.store.type, "plugins": sorted(plugins)}})

    def serve(self) -> None:
        assert self.server is not None
        if self._stopping.is_set():  # SIGTERM came before self.server was set: nothing to shut
            return
        self.server.serve_forever(poll_interval=0.2)

    def request_stop(self, *_: Any) -> None:
        if not self._stopping.is_set():
            self._stopping.set()
            threading.Thread(target=self.server.shutdown if self.server else (lambda: None),
                             daemon=True).start()

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.server_close()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        for hook in reversed(self.services.on_shutdown):
            try:
                hook()
            except Exception:
                log.exception("shutdown hook failed")
        log.info("pycnid stopped")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pycnid", description="pycni node daemon")
    parser.add_argument("--config", "-c", default=None,
                        help="daemon config (JSON); default: built-in defaults")
    parser.add_argument("--socket", default=None, help="override the socket path")
    return parser.parse_args(argv)


def run(config: DaemonConfig) -> int:
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


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        config = load_daemon_config(args.config)
    except CNIError as exc:
        sys.stderr.write(f"pycnid: {exc}\n")
        sys.exit(2)
    if args.socket:
        from dataclasses import replace
        config = replace(config, socket=args.socket)
    sys.exit(run(config))


if __name__ == "__main__":
    main()

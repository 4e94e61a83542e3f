"""pycnid's configuration file (JSON): where to listen, which store, which node this is."""

from __future__ import annotations

import json
import socket as _socket
from dataclasses import dataclass, field
from typing import Any

from cni.spec.errors import InvalidConfig
from cni.spec.wire import DEFAULT_SOCKET  # the executable's default too: one definition
from store.config import StoreConfig

DEFAULT_CONFIG_PATH = "/etc/pycni/pycnid.json"
DEFAULT_STATE_DIR = "/var/lib/pycni"
DEFAULT_WORKERS = 16
MAX_WORKERS = 1024
DEFAULT_RECEIVE_TIMEOUT = 10.0  # seconds a request may take to arrive whole on the socket
MAX_RECEIVE_TIMEOUT = 3600.0


@dataclass(frozen=True)
class DaemonConfig:
    socket: str = DEFAULT_SOCKET
    node_name: str = field(default_factory=_socket.gethostname)
    state_dir: str = DEFAULT_STATE_DIR
    store: StoreConfig = field(
        default_factory=lambda: StoreConfig(path=f"{DEFAULT_STATE_DIR}/store.db")
    )
    metrics_address: str | None = None
    log_level: str = "info"
    fault_injection: bool = False
    workers: int = DEFAULT_WORKERS  # pooled request threads of the socket server
    receive_timeout: float = DEFAULT_RECEIVE_TIMEOUT
    raw: dict[str, Any] = field(default_factory=dict)


def parse_daemon_config(data: dict[str, Any]) -> DaemonConfig:
    if not isinstance(data, dict):
        raise InvalidConfig("daemon config is not a JSON object")
    store = data.get("store") or {}
    if not isinstance(store, dict) or store.get("type", "sqlite") not in ("sqlite", "etcd"):
        raise InvalidConfig(
            "invalid daemon config key 'store'", "expected {'type': 'sqlite'|'etcd', ...}"
        )
    state_dir = text(data, "stateDir", DEFAULT_STATE_DIR)
    store_cfg = StoreConfig(
        type=store.get("type", "sqlite"),
        path=text(store, "path", f"{state_dir}/store.db", "store.path"),
        endpoints=parse_endpoints(store.get("endpoints")),
        ca=text(store, "ca", None, "store.ca"),
        cert=text(store, "cert", None, "store.cert"),
        key=text(store, "key", None, "store.key"),
        options={
            k: v
            for k, v in store.items()
            if k not in ("type", "path", "endpoints", "ca", "cert", "key")
        },
    )
    if store_cfg.type == "etcd" and not store_cfg.endpoints:
        raise InvalidConfig(
            "invalid daemon config key 'store.endpoints'",
            "an etcd store needs at least one endpoint",
        )
    return DaemonConfig(
        socket=text(data, "socket", DEFAULT_SOCKET),
        node_name=text(data, "nodeName", "") or _socket.gethostname(),
        state_dir=state_dir,
        store=store_cfg,
        metrics_address=text(data, "metricsAddress", None),
        log_level=text(data, "logLevel", "info"),
        fault_injection=bool(data.get("faultInjection", False)),
        workers=parse_workers(data.get("workers", DEFAULT_WORKERS)),
        receive_timeout=parse_receive_timeout(data.get("receiveTimeout", DEFAULT_RECEIVE_TIMEOUT)),
        raw=data,
    )


def text(data: dict[str, Any], key: str, default: str | None, name: str = "") -> str | None:
    """A string key (missing or null: ``default``); anything else is code 7 naming it."""
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidConfig(
            f"invalid daemon config key '{name or key}'", f"expected a string, got {value!r}"
        )
    return value


def parse_endpoints(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise InvalidConfig(
            "invalid daemon config key 'store.endpoints'",
            f"expected a list of URLs like https://10.0.0.1:2379, got {value!r}",
        )
    return tuple(value)


def parse_workers(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
        raise InvalidConfig(
            "invalid daemon config key 'workers'",
            f"expected an integer 1..{MAX_WORKERS}, got {value!r}",
        )
    return value


def parse_receive_timeout(value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 < value <= MAX_RECEIVE_TIMEOUT
    ):
        raise InvalidConfig(
            "invalid daemon config key 'receiveTimeout'",
            f"expected seconds, a number > 0 and at most {MAX_RECEIVE_TIMEOUT:g}, got {value!r}",
        )
    return float(value)


def load_daemon_config(path: str | None) -> DaemonConfig:
    if path is None:
        return parse_daemon_config({})
    try:
        with open(path, encoding="utf-8") as fh:
            return parse_daemon_config(json.load(fh))
    except FileNotFoundError:
        raise InvalidConfig(f"daemon config {path} not found") from None
    except ValueError as exc:
        raise InvalidConfig(f"daemon config {path} is not valid JSON", str(exc)) from None

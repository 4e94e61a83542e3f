"""pycnid's configuration file (JSON), parsed and validated once, at load, into typed sections.

Nothing after ``load_daemon_config`` reads the JSON. pycnid's own keys (socket, node name,
state dir, store, metrics endpoint, log level, workers...) are fields of ``DaemonConfig``; the
other sections are typed next to the code that uses them, and built here:

- ``node``: ``nodeAddress``, ``nodeLabels`` and the liveness and outage keys of ``ipam``
  (``NodeOptions``, nodes/options.py);
- ``ipam``: ``nodeLabels`` and the lease service's keys of ``ipam`` (``DaemonOptions``,
  plugins/ipam/config.py);
- ``overlay``: the ``overlay`` section (``OverlayConfig``, overlay/config.py); None without it;
- ``proxy``: the ``services`` section (``ProxyConfig``, services/proxy/config.py); None unless
  ``services.proxy`` is true;
- ``netpol``: the ``networkPolicy`` section (``NetpolConfig``, netpol/config.py); None unless
  ``networkPolicy.enforce`` is true;
- ``kube``: the ``kubernetes`` section (``KubeConfig``, kube/config.py): the API server as the
  source of Services and their endpoints; None without it.

Every problem is InvalidConfig (code 7) naming the key. In pycnid's own keys it makes pycnid
exit 2 (``pycnid: <error>`` on stderr); in the sections above it is ``SectionInvalid``, which
pycnid logs as a failed start and exits 1 (pycnid/main.py), as for a store it cannot open.
`pycni` reads the same ``DaemonConfig`` (cli/open_store.py): pycnid's own keys, and a section
only where a command uses it (``pycni ipam gc``: the node section), as before the sections were
typed.
"""

from __future__ import annotations

import json
import socket as _socket
from dataclasses import dataclass, field
from typing import Any

from cni.spec.errors import InvalidConfig
from cni.spec.wire import DEFAULT_SOCKET  # the executable's default too: one definition
from kube.config import KubeConfig, parse_kube_config
from netpol.config import NetpolConfig, parse_netpol_config
from nodes.options import NodeOptions, parse_node_options
from overlay.config import OverlayConfig, parse_overlay_config
from plugins.ipam.config import DaemonOptions, parse_daemon_options
from services.proxy.config import ProxyConfig, parse_proxy_config
from store.config import StoreConfig

DEFAULT_CONFIG_PATH = "/etc/pycni/pycnid.json"
DEFAULT_STATE_DIR = "/var/lib/pycni"
DEFAULT_WORKERS = 16
MAX_WORKERS = 1024
DEFAULT_RECEIVE_TIMEOUT = 10.0  # seconds a request may take to arrive whole on the socket
MAX_RECEIVE_TIMEOUT = 3600.0
STORE_KEYS = ("type", "path", "endpoints", "ca", "cert", "key", "username", "passwordFile")


@dataclass(frozen=True)
class Sections:
    """The sections typed next to the code that uses them (the module's doc)."""

    node: NodeOptions
    ipam: DaemonOptions
    overlay: OverlayConfig | None
    proxy: ProxyConfig | None
    kube: KubeConfig | None = None
    netpol: NetpolConfig | None = None


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
    node: NodeOptions = field(default_factory=NodeOptions)
    ipam: DaemonOptions = field(default_factory=lambda: DaemonOptions({}))
    overlay: OverlayConfig | None = None  # no ``overlay`` section: a single-node network
    proxy: ProxyConfig | None = None  # None: no Service proxy on this node
    kube: KubeConfig | None = None  # None: Services come from the store
    netpol: NetpolConfig | None = None  # None: no NetworkPolicy enforcement on this node


class SectionInvalid(InvalidConfig):
    """A bad key in one of the ``Sections``, with the config's log level: pycnid logs it as a
    failed start (its message and details are the section parser's, unchanged)."""

    def __init__(self, error: InvalidConfig, log_level: str) -> None:
        super().__init__(error.msg, error.details)
        self.log_level = log_level


def parse_daemon_config(data: Any, sections: bool = True) -> DaemonConfig:
    """With ``sections=False`` only pycnid's own keys are read and the sections keep their
    defaults: `pycni` reads the store from a config whose other sections may be broken."""
    if not isinstance(data, dict):
        raise InvalidConfig("daemon config is not a JSON object")
    store = validate_store_section(data.get("store") or {})
    state_dir = text(data, "stateDir", DEFAULT_STATE_DIR)
    store_cfg = parse_store(store, state_dir)
    socket = text(data, "socket", DEFAULT_SOCKET)
    node_name = text(data, "nodeName", "") or _socket.gethostname()
    metrics_address = optional_text(data, "metricsAddress")
    log_level = text(data, "logLevel", "info")
    fault_injection = bool(data.get("faultInjection", False))
    workers = parse_workers(data.get("workers", DEFAULT_WORKERS))
    receive_timeout = parse_receive_timeout(data.get("receiveTimeout", DEFAULT_RECEIVE_TIMEOUT))
    parsed = (
        parse_sections(data, log_level)
        if sections
        else Sections(NodeOptions(), DaemonOptions({}), None, None)
    )
    return DaemonConfig(
        socket=socket,
        node_name=node_name,
        state_dir=state_dir,
        store=store_cfg,
        metrics_address=metrics_address,
        log_level=log_level,
        fault_injection=fault_injection,
        workers=workers,
        receive_timeout=receive_timeout,
        node=parsed.node,
        ipam=parsed.ipam,
        overlay=parsed.overlay,
        proxy=parsed.proxy,
        kube=parsed.kube,
        netpol=parsed.netpol,
    )


def parse_sections(data: dict[str, Any], log_level: str) -> Sections:
    """Each section by its own parser, in the order pycnid starts what they configure."""
    try:
        ipam = parse_daemon_options(data)
        node = parse_node_options(data)
        overlay = parse_overlay_config(data)
        proxy = parse_proxy_config(data)
        kube = parse_kube_config(data)
        netpol = parse_netpol_config(data)
    except InvalidConfig as exc:
        raise SectionInvalid(exc, log_level) from None
    return Sections(node, ipam, overlay, proxy, kube, netpol)


def validate_store_section(store: Any) -> dict[str, Any]:
    if not isinstance(store, dict) or store.get("type", "sqlite") not in ("sqlite", "etcd"):
        raise InvalidConfig(
            "invalid daemon config key 'store'", "expected {'type': 'sqlite'|'etcd', ...}"
        )
    return store


def parse_store(store: dict[str, Any], state_dir: str) -> StoreConfig:
    config = StoreConfig(
        type=store.get("type", "sqlite"),
        path=text(store, "path", f"{state_dir}/store.db", "store.path"),
        endpoints=parse_endpoints(store.get("endpoints")),
        ca=optional_text(store, "ca", "store.ca"),
        cert=optional_text(store, "cert", "store.cert"),
        key=optional_text(store, "key", "store.key"),
        username=nonempty_text(store, "username", "store.username"),
        password_file=nonempty_text(store, "passwordFile", "store.passwordFile"),
        options={k: v for k, v in store.items() if k not in STORE_KEYS},  # the rest: options
    )
    if config.type == "etcd" and not config.endpoints:
        raise InvalidConfig(
            "invalid daemon config key 'store.endpoints'",
            "an etcd store needs at least one endpoint",
        )
    validate_store_user(config)
    return config


def validate_store_user(config: StoreConfig) -> None:
    """``username`` and ``passwordFile`` together, and only for etcd (code 7 naming the key)."""
    if config.username is None and config.password_file is None:
        return
    if config.type != "etcd":
        key = "username" if config.username is not None else "passwordFile"
        raise InvalidConfig(
            f"invalid daemon config key 'store.{key}'", "only an etcd store has users"
        )
    if config.username is None or config.password_file is None:
        missing = "passwordFile" if config.username is not None else "username"
        raise InvalidConfig(
            f"invalid daemon config key 'store.{missing}'",
            "etcd user authentication needs both 'username' and 'passwordFile'",
        )


def text(data: dict[str, Any], key: str, default: str, name: str = "") -> str:
    """A string key (missing or null: ``default``); anything else is code 7 naming it."""
    value = optional_text(data, key, name)
    return default if value is None else value


def optional_text(data: dict[str, Any], key: str, name: str = "") -> str | None:
    """A string key, None when missing or null; anything else is code 7 naming it."""
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidConfig(
            f"invalid daemon config key '{name or key}'", f"expected a string, got {value!r}"
        )
    return value


def nonempty_text(data: dict[str, Any], key: str, name: str) -> str | None:
    """A non-empty string key, None when missing or null; anything else is code 7 naming it."""
    value = optional_text(data, key, name)
    if value == "":
        raise InvalidConfig(f"invalid daemon config key '{name}'", "expected a non-empty string")
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


def load_daemon_config(path: str | None, sections: bool = True) -> DaemonConfig:
    if path is None:
        return parse_daemon_config({})
    try:
        with open(path, encoding="utf-8") as fh:
            return parse_daemon_config(json.load(fh), sections)
    except FileNotFoundError:
        raise InvalidConfig(f"daemon config {path} not found") from None
    except ValueError as exc:
        raise InvalidConfig(f"daemon config {path} is not valid JSON", str(exc)) from None

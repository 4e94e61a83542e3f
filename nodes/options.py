"""The daemon config keys for node liveness, outage tolerance and dead-node reclamation.

Keys of pycnid's JSON config, parsed once at load by ``pycnid/config.py`` into
``DaemonConfig.node``, beside the others::

    "nodeAddress": "172.31.250.11",      # underlay address in the node record (default: the
                                         # source address towards the first etcd endpoint)
    "nodeLabels": {"zone": "a"},         # also used for pool nodeSelectors
    "ipam": {"bufferSize": 8,            # addresses reserved per pool for etcd outages (0: none)
             "heartbeatTTL": 10,         # seconds; the etcd lease of /pycni/v1/heartbeats/<node>
             "reapGrace": 900,           # seconds a heartbeat must stay gone before reclaiming
             "reapInterval": 60,         # seconds between two reaper passes on this node (0: off)
             "addBudget": 2}             # seconds one store call of an ADD/DEL may take

Every bad value is ``InvalidConfig`` naming the key, so pycnid refuses to start with it. The
parse is pure: the default address (a route lookup towards etcd) is found at start-up, by
``calc_node_address``.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from cni.spec.errors import InvalidConfig


@dataclass(frozen=True)
class NodeOptions:
    address: str | None = None  # nodeAddress as configured; None: ``calc_node_address`` finds it
    labels: Mapping[str, str] = field(default_factory=dict)
    buffer_size: int = 8
    heartbeat_ttl: int = 10
    reap_grace: float = 900.0
    reap_interval: float = 60.0
    add_budget: float = 2.0


NUMBERS = {  # config key -> (attribute, minimum, maximum, integer)
    "bufferSize": ("buffer_size", 0, 64, True),
    "heartbeatTTL": ("heartbeat_ttl", 2, 300, True),
    "reapGrace": ("reap_grace", 0, 30 * 86400, False),
    "reapInterval": ("reap_interval", 0, 86400, False),
    "addBudget": ("add_budget", 0.1, 60, False),
}


def parse_node_options(raw: Mapping[str, Any]) -> NodeOptions:
    ipam = raw.get("ipam", {})
    if not isinstance(ipam, dict):
        raise InvalidConfig("invalid daemon config key 'ipam'", "expected an object")
    values = {
        attr: validate_number(f"ipam.{key}", ipam[key], lo, hi, integer)
        for key, (attr, lo, hi, integer) in NUMBERS.items()
        if key in ipam
    }
    return NodeOptions(
        address=parse_address(raw.get("nodeAddress")),
        labels=parse_labels(raw.get("nodeLabels")),
        **values,
    )


def validate_number(key: str, value: Any, lo: float, hi: float, integer: bool) -> Any:
    ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    if not ok or not lo <= value <= hi:
        kind = "an integer" if integer else "a number"
        raise InvalidConfig(
            f"invalid daemon config key '{key}'",
            f"expected {kind} between {lo:g} and {hi:g}, got {value!r}",
        )
    return value if integer else float(value)


def parse_labels(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidConfig(
            "invalid daemon config key 'nodeLabels'", "expected an object of string labels"
        )
    return dict(value)


def parse_address(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidConfig("invalid daemon config key 'nodeAddress'", "expected a string")
    return value


def calc_node_address(configured: str | None, etcd_endpoints: tuple[str, ...]) -> str:
    """The address of the node record: ``nodeAddress`` when configured, else the source
    address towards the first etcd endpoint, else "" (no etcd)."""
    if configured is not None:
        return configured
    return calc_source_address(etcd_endpoints[0]) if etcd_endpoints else ""


def calc_source_address(endpoint: str) -> str:
    """The local address the kernel would use towards ``endpoint`` (no packet is sent)."""
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((host, parts.port or 2379))
            return str(sock.getsockname()[0])
    except (OSError, ValueError):
        return ""

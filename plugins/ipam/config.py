"""pycni-ipam's netconf: which pools or ranges, routes, dns; pycnid's IPAM options.

Where addresses come from (``ipam.alloc.selection``), first match wins:

- the ``ipRanges`` capability (``runtimeConfig.ipRanges``): host-local style range sets;
- ``ipam.pools: ["v4pool", "v6pool"]``: cluster pools by name, one address per IP family;
- ``ipam.ranges`` (as host-local) = a list of range sets, each a list of ``{subnet,
  rangeStart?, rangeEnd?, gateway?, blockSize?}``, and the shorthand ``ipam.subnet`` /
  ``rangeStart`` / ``rangeEnd`` / ``gateway`` (prepended as its own range set); one address
  per range set;
- none of them: every enabled cluster pool whose node selector matches this node.

``pools`` together with ``ranges``/``subnet`` is refused. Every problem is InvalidConfig
(code 7) naming the key. The ranges are parsed in ``plugins.ipam.ranges``, the requested
static IPs in ``plugins.ipam.requested``.
"""

from __future__ import annotations

import ipaddress
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cni.spec.errors import InvalidConfig
from cni.spec.result import ROUTE_INT_LIMITS
from ipam.alloc.allocator import Range
from ipam.alloc.selection import Selection
from ipam.records import DEFAULT_BLOCK_GRACE
from plugins.ipam.ranges import invalid, parse_ip, parse_range_sets

CACHE_SIZE = 256  # distinct IPAM netconfs remembered (cleared whole when full)
DNS_LIST_KEYS = ("nameservers", "search", "options")
GATEWAY_KEYS = ("isDefaultGateway", "isGateway")  # main plugin keys that need a gateway


@dataclass(frozen=True)
class IpamConfig:
    network: str
    range_sets: tuple[tuple[Range, ...], ...]
    routes: tuple[dict, ...] = ()
    dns: Mapping[str, Any] | None = None
    pools: tuple[str, ...] = ()  # cluster pools by name; neither these nor ranges: selectors
    gateway_key: str = ""  # main plugin key (isGateway...) that puts each gateway on the node

    @property
    def selection(self) -> Selection:
        return Selection(self.network, self.range_sets, self.pools, self.gateway_key)


def parse_ipam_config(config: Mapping[str, Any]) -> IpamConfig:
    ipam = config.get("ipam")
    if not isinstance(ipam, dict):
        raise invalid("ipam", "expected an object")
    runtime = config.get("runtimeConfig")
    pools = parse_pool_names(ipam)
    by_capability = isinstance(runtime, dict) and bool(runtime.get("ipRanges"))
    range_sets: tuple[tuple[Range, ...], ...] = ()
    if by_capability or (not pools and ("ranges" in ipam or "subnet" in ipam)):
        range_sets = parse_range_sets(ipam, runtime)
    return IpamConfig(
        str(config["name"]),
        range_sets,
        parse_routes(ipam.get("routes")),
        parse_dns(ipam.get("dns")),
        () if by_capability else pools,
        calc_gateway_key(config),
    )


def calc_gateway_key(config: Mapping[str, Any]) -> str:
    """The main plugin's key that makes it put each address's gateway on the node (the
    bridge's ``isGateway`` / ``isDefaultGateway``), or "": every address then needs one."""
    return next((key for key in GATEWAY_KEYS if config.get(key) is True), "")


_parsed: dict[str, IpamConfig] = {}


def cached_ipam_config(config: Mapping[str, Any]) -> IpamConfig:
    """``parse_ipam_config``, remembered by what it reads (name, ``ipam``, the ``ipRanges``
    capability): the same netconf on every ADD of a network is validated once. A bad config is
    never remembered, so it fails the same way every time."""
    key = ipam_config_key(config)
    if key is None:
        return parse_ipam_config(config)
    cfg = _parsed.get(key)
    if cfg is None:
        cfg = parse_ipam_config(config)
        if len(_parsed) >= CACHE_SIZE:
            _parsed.clear()
        _parsed[key] = cfg
    return cfg


def ipam_config_key(config: Mapping[str, Any]) -> str | None:
    """Everything ``parse_ipam_config`` reads, as text; None when it is not JSON data."""
    runtime = config.get("runtimeConfig")
    ip_ranges = runtime.get("ipRanges") if isinstance(runtime, dict) else None
    try:
        return json.dumps(
            (config.get("name"), config.get("ipam"), ip_ranges or None, calc_gateway_key(config))
        )
    except (TypeError, ValueError):
        return None


def parse_pool_names(ipam: Mapping) -> tuple[str, ...]:
    value = ipam.get("pools")
    if value is None:
        return ()
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, str) and v for v in value)
    ):
        raise invalid("ipam.pools", "expected a non-empty list of pool names")
    if "ranges" in ipam or "subnet" in ipam:
        raise invalid(
            "ipam.pools",
            "set either ipam.pools (cluster pools) or "
            "ipam.ranges/ipam.subnet (host-local style), not both",
        )
    return tuple(value)


def parse_routes(value: Any) -> tuple[dict, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid("ipam.routes", "expected a list of {dst, gw?}")
    return tuple(parse_route(item, f"ipam.routes[{i}]") for i, item in enumerate(value))


def parse_route(item: Any, key: str) -> dict:
    """One ``ipam.routes`` entry; the integers must fit what netlink carries (u32, scope u8)."""
    if not isinstance(item, dict) or not isinstance(item.get("dst"), str):
        raise invalid(key, "expected an object with a 'dst' CIDR")
    try:
        dst = ipaddress.ip_network(item["dst"], strict=False)
    except ValueError:
        raise invalid(f"{key}.dst", f"{item['dst']!r} is not a CIDR") from None
    route: dict = {"dst": str(dst)}
    if item.get("gw") not in (None, ""):
        route["gw"] = str(parse_ip(item["gw"], f"{key}.gw", dst))
    for name, top in ROUTE_INT_LIMITS.items():
        if item.get(name) is not None:
            route[name] = parse_uint(item[name], f"{key}.{name}", top)
    return route


def parse_uint(value: Any, key: str, top: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise invalid(key, f"expected an integer 0..{top}, got {value!r}")
    return value


def parse_dns(value: Any) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("ipam.dns", "expected {nameservers, domain, search, options}")
    dns: dict = {}
    for name in DNS_LIST_KEYS:
        if name in value:
            items = value[name]
            if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
                raise invalid(f"ipam.dns.{name}", "expected a list of strings")
            dns[name] = list(items)
    if "domain" in value:
        if not isinstance(value["domain"], str):
            raise invalid("ipam.dns.domain", "expected a string")
        dns["domain"] = value["domain"]
    return dns


@dataclass(frozen=True)
class DaemonOptions:
    """pycnid config keys of the IPAM: ``nodeLabels``, ``ipam.blockReturnGrace``,
    ``ipam.housekeepingInterval``, ``ipam.metricsInterval``; parsed once at load by
    ``pycnid/config.py`` into ``DaemonConfig.ipam``."""

    labels: Mapping[str, str]
    block_grace: float = DEFAULT_BLOCK_GRACE
    housekeeping_interval: float = 30.0
    metrics_interval: float = 30.0


def parse_daemon_options(raw: Mapping[str, Any]) -> DaemonOptions:
    labels = raw.get("nodeLabels") or {}
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise InvalidConfig(
            "invalid daemon config key 'nodeLabels'", "expected an object of string labels"
        )
    ipam = raw.get("ipam") or {}
    if not isinstance(ipam, dict):
        raise InvalidConfig("invalid daemon config key 'ipam'", "expected an object")
    values = {
        attr: _seconds(ipam[key], f"ipam.{key}")
        for key, attr in (
            ("blockReturnGrace", "block_grace"),
            ("housekeepingInterval", "housekeeping_interval"),
            ("metricsInterval", "metrics_interval"),
        )
        if key in ipam
    }
    return DaemonOptions(dict(labels), **values)


def _seconds(value: Any, key: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 <= value <= threading.TIMEOUT_MAX
    ):  # not NaN, inf, 1e400: no thread waits them
        raise InvalidConfig(
            f"invalid daemon config key '{key}'",
            f"expected a number of seconds >= 0, got {value!r}",
        )
    return float(value)

"""pycni-ipam's netconf: which pools, routes, dns, and the requested static IPs.

Where addresses come from (``ipam.alloc.selection``), first match wins:

- the ``ipRanges`` capability (``runtimeConfig.ipRanges``): host-local style range sets;
- ``ipam.pools: ["v4pool", "v6pool"]``: cluster pools by name, one address per IP family;
- ``ipam.ranges`` (as host-local) = a list of range sets, each a list of ``{subnet,
  rangeStart?, rangeEnd?, gateway?, blockSize?}``, and the shorthand ``ipam.subnet`` /
  ``rangeStart`` / ``rangeEnd`` / ``gateway`` (prepended as its own range set); one address
  per range set;
- none of them: every enabled cluster pool whose node selector matches this node.

``pools`` together with ``ranges``/``subnet`` is refused. Every problem is InvalidConfig
(code 7) naming the key.
"""
from __future__ import annotations

import ipaddress
import json
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from cni.spec.errors import InvalidConfig
from ipam.alloc.allocator import IPAddr, Range, is_reserved_v4
from ipam.records import IPNet
from ipam.alloc.selection import Selection

CACHE_SIZE = 256  # distinct IPAM netconfs remembered (cleared whole when full)
UINT32_MAX = 2**32 - 1
ROUTE_INT_KEYS = {"mtu": UINT32_MAX, "advmss": UINT32_MAX, "priority": UINT32_MAX,
                  "table": UINT32_MAX, "scope": 255}
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


@dataclass(frozen=True)
class Requested:
    ip: IPAddr
    source: str  # "CNI_ARGS IP", "runtimeConfig.ips[0]", "args.cni.ips[1]"


def invalid(key: str, details: str) -> InvalidConfig:
    return InvalidConfig(f"invalid {key}", details)


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
    return IpamConfig(str(config["name"]), range_sets, parse_routes(ipam.get("routes")),
                      parse_dns(ipam.get("dns")), () if by_capability else pools,
                      calc_gateway_key(config))


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
        return json.dumps((config.get("name"), config.get("ipam"), ip_ranges or None,
                           calc_gateway_key(config)))
    except (TypeError, ValueError):
        return None


def parse_pool_names(ipam: Mapping) -> tuple[str, ...]:
    value = ipam.get("pools")
    if value is None:
        return ()
    if not isinstance(value, list) or not value or \
            not all(isinstance(v, str) and v for v in value):
        raise invalid("ipam.pools", "expected a non-empty list of pool names")
    if "ranges" in ipam or "subnet" in ipam:
        raise invalid("ipam.pools", "set either ipam.pools (cluster pools) or "
                                    "ipam.ranges/ipam.subnet (host-local style), not both")
    return tuple(value)


def parse_range_sets(ipam: Mapping, runtime: Any) -> tuple[tuple[Range, ...], ...]:
    if isinstance(runtime, dict) and runtime.get("ipRanges"):
        sets = _parse_sets(runtime["ipRanges"], "runtimeConfig.ipRanges")
    else:
        sets = _parse_sets(ipam.get("ranges", []), "ipam.ranges")
        if ipam.get("subnet") is not None:
            sets = ((parse_range(ipam, "ipam"),),) + sets
    if not sets:
        raise InvalidConfig("invalid ipam config: no address range",
                            "set ipam.ranges (a list of range sets) or ipam.subnet")
    validate_no_overlap(sets)
    return sets


def _parse_sets(value: Any, key: str) -> tuple[tuple[Range, ...], ...]:
    if not isinstance(value, list):
        raise invalid(key, "expected a list of range sets (each a list of ranges)")
    sets = []
    for i, items in enumerate(value):
        if not isinstance(items, list) or not items:
            raise invalid(f"{key}[{i}]", "a range set is a non-empty list of ranges")
        ranges = tuple(parse_range(item, f"{key}[{i}][{j}]") for j, item in enumerate(items))
        for rng in ranges[1:]:
            if rng.subnet.version != ranges[0].subnet.version:
                raise invalid(rng.where, f"range set {key}[{i}] mixes IPv4 and IPv6")
        sets.append(ranges)
    return tuple(sets)


def parse_subnet(value: Any, key: str) -> IPNet:
    if not isinstance(value, str) or "/" not in value:
        raise invalid(key, f"expected a CIDR string like 10.22.0.0/16, got {value!r}")
    try:
        iface = ipaddress.ip_interface(value)
    except ValueError as exc:
        raise invalid(key, f"{value!r} is not a CIDR: {exc}") from None
    subnet = iface.network
    if iface.ip != subnet.network_address:
        raise invalid(key, f"{value!r} has host bits set; the network is {subnet}")
    if subnet.prefixlen > subnet.max_prefixlen - 2:
        raise invalid(key, f"network {subnet} is too small to allocate from")
    return subnet


def parse_ip(value: Any, key: str, subnet: IPNet | None = None) -> IPAddr:
    if not isinstance(value, str):  # ip_address(5) would be 0.0.0.5
        raise invalid(key, f"expected an IP address string, got {value!r}")
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        raise invalid(key, f"{value!r} is not an IP address") from None
    if subnet is not None and ip.version != subnet.version:
        raise invalid(key, f"{ip} is not of the same IP family as {subnet}")
    return ip


def parse_range(item: Any, where: str) -> Range:
    if not isinstance(item, dict):
        raise invalid(where, "expected an object with 'subnet'")
    subnet = parse_subnet(item.get("subnet"), f"{where}.subnet")
    start, end = _range_limits(item, where, subnet)
    gateway = (parse_gateway(item["gateway"], f"{where}.gateway", subnet)
               if item.get("gateway") else subnet.network_address + 1)
    return Range(subnet, start, end, gateway, _block_size(item.get("blockSize"), where, subnet),
                 where)


def parse_gateway(value: Any, key: str, subnet: IPNet) -> IPAddr:
    """A range's explicit gateway: a host address of its own subnet (one outside it may be an
    address another range set hands out, and the bridge holds it with the subnet's prefix)."""
    ip = parse_ip(value, key, subnet)
    if ip not in subnet or is_reserved_v4(subnet, ip):
        raise invalid(key, f"{ip} is not a host address of network {subnet}")
    return ip


def _range_limits(item: Mapping, where: str, subnet: IPNet) -> tuple[IPAddr, IPAddr]:
    start = subnet.network_address + 1
    end = subnet.broadcast_address - (1 if subnet.version == 4 else 0)
    if item.get("rangeStart"):
        start = parse_ip(item["rangeStart"], f"{where}.rangeStart", subnet)
    if item.get("rangeEnd"):
        end = parse_ip(item["rangeEnd"], f"{where}.rangeEnd", subnet)
    for key, ip in (("rangeStart", start), ("rangeEnd", end)):
        if ip not in subnet:
            raise invalid(f"{where}.{key}", f"{ip} is not in network {subnet}")
    if start > end:
        raise invalid(f"{where}.rangeStart", f"{start} is after rangeEnd {end}")
    return start, end


def _block_size(value: Any, where: str, subnet: IPNet) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or \
            not 0 <= value <= subnet.max_prefixlen:
        raise invalid(f"{where}.blockSize",
                      f"expected a prefix length 0..{subnet.max_prefixlen}, got {value!r}")
    return value


def validate_no_overlap(sets: tuple[tuple[Range, ...], ...]) -> None:
    """Range sets must not share addresses; within a set, one subnet may hold several
    disjoint ranges."""
    flat = [(i, rng) for i, ranges in enumerate(sets) for rng in ranges]
    for n, (i, a) in enumerate(flat):
        for j, b in flat[n + 1:]:
            if a.subnet.version != b.subnet.version or not a.subnet.overlaps(b.subnet):
                continue
            if i == j and a.subnet == b.subnet and (a.end < b.start or b.end < a.start):
                continue
            raise invalid(b.where, f"{b.describe()} overlaps {a.where} {a.describe()}")


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
    for name, top in ROUTE_INT_KEYS.items():
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


def parse_requested_ips(config: Mapping[str, Any],
                        cni_args: Mapping[str, str]) -> tuple[Requested, ...]:
    """Static addresses asked for by `IP=` in CNI_ARGS, `runtimeConfig.ips`, `args.cni.ips`."""
    found: dict[IPAddr, Requested] = {}
    if cni_args.get("IP"):
        for text in cni_args["IP"].split(","):
            _add_requested(found, text.strip(), "CNI_ARGS IP")
    args = config.get("args")
    sources = (("runtimeConfig.ips", config.get("runtimeConfig")),
               ("args.cni.ips", args.get("cni") if isinstance(args, dict) else None))
    for key, holder in sources:
        items = holder.get("ips") if isinstance(holder, dict) else None
        if items is None:
            continue
        if not isinstance(items, list):
            raise invalid(key, "expected a list of IP addresses")
        for i, text in enumerate(items):
            _add_requested(found, text, f"{key}[{i}]")
    return tuple(found.values())


def _add_requested(found: dict[IPAddr, Requested], text: Any, source: str) -> None:
    if not isinstance(text, str):  # ip_interface(5) would be 0.0.0.5
        raise invalid(source, f"expected an IP address string, got {text!r}")
    try:
        ip = ipaddress.ip_interface(text).ip
    except (ValueError, TypeError):
        raise invalid(source, f"{text!r} is not an IP address") from None
    found.setdefault(ip, Requested(ip, source))


def requested_by_set(cfg: IpamConfig, requested: tuple[Requested, ...]) -> dict[int, IPAddr]:
    """Map each requested address to its range set; an address outside every range, a gateway
    or two addresses for one range set is InvalidConfig."""
    out: dict[int, Requested] = {}
    for req in requested:
        index = _set_of(cfg, req)
        if index in out:
            raise InvalidConfig(f"two addresses requested from range set {index}",
                                f"{out[index].ip} ({out[index].source}) and {req.ip} "
                                f"({req.source}); one address is leased per range set")
        out[index] = req
    return {index: req.ip for index, req in out.items()}


def _set_of(cfg: IpamConfig, req: Requested) -> int:
    for index, ranges in enumerate(cfg.range_sets):
        for rng in ranges:
            if rng.contains(req.ip) and not is_reserved_v4(rng.subnet, req.ip):
                if any(r.gateway == req.ip for r in ranges):
                    raise InvalidConfig(f"requested address {req.ip} ({req.source}) is a gateway",
                                        f"it is the gateway of {rng.where} {rng.describe()}")
                return index
    known = "; ".join(r.describe() for ranges in cfg.range_sets for r in ranges)
    raise InvalidConfig(f"requested address {req.ip} ({req.source}) is outside every range",
                        f"ranges: {known}")


@dataclass(frozen=True)
class DaemonOptions:
    """pycnid config keys of the IPAM: ``nodeLabels``, ``ipam.blockReturnGrace``,
    ``ipam.housekeepingInterval``, ``ipam.metricsInterval``."""

    labels: Mapping[str, str]
    block_grace: float = 300.0
    housekeeping_interval: float = 30.0
    metrics_interval: float = 30.0


def parse_daemon_options(raw: Mapping[str, Any]) -> DaemonOptions:
    labels = raw.get("nodeLabels") or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in labels.items()):
        raise InvalidConfig("invalid daemon config key 'nodeLabels'",
                            "expected an object of string labels")
    ipam = raw.get("ipam") or {}
    if not isinstance(ipam, dict):
        raise InvalidConfig("invalid daemon config key 'ipam'", "expected an object")
    values = {attr: _seconds(ipam[key], f"ipam.{key}") for key, attr in
              (("blockReturnGrace", "block_grace"),
               ("housekeepingInterval", "housekeeping_interval"),
               ("metricsInterval", "metrics_interval")) if key in ipam}
    return DaemonOptions(dict(labels), **values)


def _seconds(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not 0 <= value <= threading.TIMEOUT_MAX:  # not NaN, inf, 1e400: no thread waits them
        raise InvalidConfig(f"invalid daemon config key '{key}'",
                            f"expected a number of seconds >= 0, got {value!r}")
    return float(value)

"""CNI results: one canonical form (the 1.1.0 shape) and conversion to every version.

Mirrors ``pkg/types`` of the reference library, so a runtime gets what libcni would give:
0.3.x/0.4.0 carry ``ips[].version``; 1.0.0/1.1.0 do not; interfaces lose ``mtu``,
``socketPath`` and ``pciID`` below 1.1.0 and routes keep only ``dst``/``gw`` below 1.0.0.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from cni.spec.errors import DecodingFailure
from cni.spec.versions import SUPPORTED, parse_version

IFACE_KEYS_1_1 = ("name", "mac", "mtu", "sandbox", "socketPath", "pciID")
IFACE_KEYS_OLD = ("name", "mac", "sandbox")
ROUTE_KEYS_1_1 = ("dst", "gw", "mtu", "advmss", "priority", "table", "scope")
ROUTE_KEYS_OLD = ("dst", "gw")
DNS_KEYS = ("nameservers", "domain", "search", "options")
DNS_LIST_KEYS = ("nameservers", "search", "options")
UINT32_MAX = 2**32 - 1
# the integers of a route and the largest each can be: what netlink carries (u32; scope u8)
ROUTE_INT_LIMITS = {
    "mtu": UINT32_MAX,
    "advmss": UINT32_MAX,
    "priority": UINT32_MAX,
    "table": UINT32_MAX,
    "scope": 255,
}


def ip_family(address: str) -> str:
    """'10.0.0.2/24' -> '4'; 'fd00::2/64' -> '6'."""
    return "4" if ipaddress.ip_interface(address).version == 4 else "6"


def _pick(item: dict, keys: tuple[str, ...]) -> dict:
    return {k: item[k] for k in keys if k in item and item[k] not in (None, "")}


def _is_v1(version: str) -> bool:
    return parse_version(version) >= (1, 0, 0)


def canonical(result: Any, version: str | None = None, where: str = "prevResult") -> dict:
    """Parse a result of any supported version into the canonical 1.1.0 shape.

    Every field is checked for its type and range: a problem is DecodingFailure (code 6)
    naming it from ``where`` ("prevResult.routes[0].dst").
    """
    if not isinstance(result, dict):
        raise DecodingFailure(f"{where} is not a JSON object", f"got {type(result).__name__}")
    version = result.get("cniVersion") or version or "1.1.0"
    if not isinstance(version, str):
        raise malformed(f"{where}.cniVersion", "a version string like 1.1.0", version)
    parse_version(version)
    interfaces = [
        _canonical_iface(item, f"{where}.interfaces[{n}]")
        for n, item in enumerate(_items(result, "interfaces", where))
    ]
    return {
        "cniVersion": "1.1.0",
        "interfaces": interfaces,
        "ips": [
            _canonical_ip(item, f"{where}.ips[{n}]", len(interfaces))
            for n, item in enumerate(_items(result, "ips", where))
        ],
        "routes": [
            _canonical_route(item, f"{where}.routes[{n}]")
            for n, item in enumerate(_items(result, "routes", where))
        ],
        "dns": _canonical_dns(result.get("dns"), f"{where}.dns"),
    }


def malformed(key: str, expected: str, value: Any) -> DecodingFailure:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:80] + "…"
    return DecodingFailure(f"invalid {key}", f"expected {expected}, got {shown}")


def _items(holder: dict, key: str, where: str) -> list[dict]:
    value = holder.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise malformed(f"{where}.{key}", "a list", value)
    for n, item in enumerate(value):
        if not isinstance(item, dict):
            raise malformed(f"{where}.{key}[{n}]", "an object", item)
    return value


def _text(item: dict, key: str, where: str) -> str | None:
    value = item.get(key)
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise malformed(f"{where}.{key}", "a string", value)
    return value


def _uint(item: dict, key: str, where: str, top: int = UINT32_MAX) -> int | None:
    value = item.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise malformed(f"{where}.{key}", f"an integer 0..{top}", value)
    return value


def _address(item: dict, key: str, where: str, parse: Callable, expected: str) -> Any:
    text = _text(item, key, where)
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError:
        raise malformed(f"{where}.{key}", expected, text) from None


def _ip(item: dict, key: str, where: str, family: int) -> str | None:
    ip = _address(item, key, where, ipaddress.ip_address, "an IP address")
    if ip is not None and ip.version != family:
        raise malformed(f"{where}.{key}", f"an IPv{family} address", str(ip))
    return None if ip is None else str(ip)


def _present(out: dict) -> dict:
    return {k: v for k, v in out.items() if v is not None}


def _canonical_iface(item: dict, where: str) -> dict:
    out: dict[str, str | int | None] = {
        key: _text(item, key, where) for key in IFACE_KEYS_1_1 if key != "mtu"
    }
    out["mtu"] = _uint(item, "mtu", where)
    return _present({key: out[key] for key in IFACE_KEYS_1_1})


def _canonical_ip(item: dict, where: str, interfaces: int) -> dict:
    address = _address(item, "address", where, ipaddress.ip_interface, "a CIDR address")
    if address is None:
        raise malformed(f"{where}.address", "a CIDR address like 10.0.0.2/24", item.get("address"))
    index = _uint(item, "interface", where)
    if index is not None and index >= interfaces:
        raise malformed(
            f"{where}.interface",
            f"an index into interfaces (0..{interfaces - 1})"
            if interfaces
            else "no index (the result lists no interfaces)",
            index,
        )
    return _present(
        {
            "address": str(address),
            "gateway": _ip(item, "gateway", where, address.version),
            "interface": index,
        }
    )


def _canonical_route(item: dict, where: str) -> dict:
    dst = _address(
        item,
        "dst",
        where,
        lambda t: ipaddress.ip_network(t, strict=False),
        "a CIDR like 0.0.0.0/0",
    )
    if dst is None:
        raise malformed(f"{where}.dst", "a CIDR like 0.0.0.0/0", item.get("dst"))
    out = {"dst": item["dst"], "gw": _ip(item, "gw", where, dst.version)}
    for key, top in ROUTE_INT_LIMITS.items():
        out[key] = _uint(item, key, where, top)
    return _present({key: out[key] for key in ROUTE_KEYS_1_1})


def _canonical_dns(dns: Any, where: str) -> dict:
    if dns is None:
        return {}
    if not isinstance(dns, dict):
        raise malformed(where, "an object", dns)
    out: dict[str, str | list[str] | None] = {"domain": _text(dns, "domain", where)}
    for key in DNS_LIST_KEYS:
        items = dns.get(key)
        if items is not None and not (
            isinstance(items, list) and all(isinstance(i, str) for i in items)
        ):
            raise malformed(f"{where}.{key}", "a list of strings", items)
        out[key] = None if items is None else list(items)
    return _present({key: out[key] for key in DNS_KEYS})


def render(result: dict, version: str) -> dict:
    """The canonical result as a result of exactly ``version``."""
    if version not in SUPPORTED:
        parse_version(version)
    if _is_v1(version):
        return _render_v1(result, version)
    return _render_v04(result, version)


def _render_v1(result: dict, version: str) -> dict:
    out: dict = {"cniVersion": version}
    if result.get("interfaces"):
        out["interfaces"] = [_pick(i, IFACE_KEYS_1_1) for i in result["interfaces"]]
    if result.get("ips"):
        out["ips"] = [dict(ip) for ip in result["ips"]]
    if result.get("routes"):
        out["routes"] = [_pick(r, ROUTE_KEYS_1_1) for r in result["routes"]]
    out["dns"] = dict(result.get("dns") or {})
    return out


def _render_v04(result: dict, version: str) -> dict:
    out: dict = {"cniVersion": version}
    if result.get("interfaces"):
        out["interfaces"] = [_pick(i, IFACE_KEYS_OLD) for i in result["interfaces"]]
    if result.get("ips"):
        out["ips"] = [{"version": ip_family(ip["address"]), **ip} for ip in result["ips"]]
    if result.get("routes"):
        out["routes"] = [_pick(r, ROUTE_KEYS_OLD) for r in result["routes"]]
    out["dns"] = dict(result.get("dns") or {})
    return out


def convert(result: dict, version: str) -> dict:
    """Convert a result of any supported version to ``version``."""
    return render(canonical(result), version)

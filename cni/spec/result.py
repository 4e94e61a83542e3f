"""CNI results: one canonical form (the 1.1.0 shape) and conversion to every version.

Mirrors ``pkg/types`` of the reference library (CNI-CHECKLIST §1.6):
0.3.x/0.4.0 carry ``ips[].version``; 1.0.0/1.1.0 do not; interfaces lose ``mtu``,
``socketPath`` and ``pciID`` below 1.1.0 and routes keep only ``dst``/``gw`` below 1.0.0.
"""
from __future__ import annotations

import ipaddress
from typing import Any

from .errors import DecodingFailure
from .versions import SUPPORTED, parse_version

IFACE_KEYS_1_1 = ("name", "mac", "mtu", "sandbox", "socketPath", "pciID")
IFACE_KEYS_OLD = ("name", "mac", "sandbox")
ROUTE_KEYS_1_1 = ("dst", "gw", "mtu", "advmss", "priority", "table", "scope")
ROUTE_KEYS_OLD = ("dst", "gw")
DNS_KEYS = ("nameservers", "domain", "search", "options")


def ip_family(address: str) -> str:
    """'10.0.0.2/24' -> '4'; 'fd00::2/64' -> '6'."""
    return "4" if ipaddress.ip_interface(address).version == 4 else "6"


def _pick(item: dict, keys: tuple[str, ...]) -> dict:
    return {k: item[k] for k in keys if k in item and item[k] not in (None, "")}


def _is_v1(version: str) -> bool:
    return parse_version(version) >= (1, 0, 0)


def canonical(result: Any, version: str | None = None) -> dict:
    """Parse a result of any supported version into the canonical 1.1.0 shape.

    Raises DecodingFailure (code 6) when it is not a result at all.
    """
    if not isinstance(result, dict):
        raise DecodingFailure("result is not a JSON object", f"got {type(result).__name__}")
    version = str(result.get("cniVersion") or version or "1.1.0")
    parse_version(version)
    out: dict = {"cniVersion": "1.1.0"}
    try:
        out["interfaces"] = [_pick(i, IFACE_KEYS_1_1) for i in result.get("interfaces") or []]
        out["ips"] = [_canonical_ip(ip) for ip in result.get("ips") or []]
        out["routes"] = [_pick(r, ROUTE_KEYS_1_1) for r in result.get("routes") or []]
        out["dns"] = _pick(result.get("dns") or {}, DNS_KEYS)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise DecodingFailure("malformed result", str(exc)) from None
    return out


def _canonical_ip(ip: dict) -> dict:
    address = str(ipaddress.ip_interface(ip["address"]))
    out: dict = {"address": address}
    if ip.get("gateway"):
        out["gateway"] = str(ipaddress.ip_address(ip["gateway"]))
    if ip.get("interface") is not None:
        out["interface"] = int(ip["interface"])
    return out


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

"""Each pool setting parsed and validated, PoolInvalid (code 7) naming the bad one.

The limits a pool record must keep (block sizes per IP family, the longest reuse delay, the
gateway modes, Kubernetes label syntax for node selectors) and the defaults a record may leave
out. ``ipam.alloc.pool_spec`` builds a ``PoolSpec`` from them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Any

from cni.spec.errors import InvalidConfig
from ipam.alloc.intervals import Interval
from ipam.records import IPNet

DEFAULT_BLOCK_SIZE = {4: 26, 6: 122}
BLOCK_SIZE_LIMITS = {4: (20, 32), 6: (116, 128)}
DEFAULT_REUSE_DELAY = 120
MAX_REUSE_DELAY = 86400
GATEWAY_MODES = ("none", "first")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
LABEL_KEY_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,252}[A-Za-z0-9])?")
LABEL_VALUE_RE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?")


class PoolInvalid(InvalidConfig):
    """A pool setting that cannot be accepted; the message names the setting."""


def invalid(what: str, details: str) -> PoolInvalid:
    return PoolInvalid(f"invalid {what}", details)


def parse_exclusion(text: str, cidr: IPNet) -> Interval:
    """``"10.0.0.0/30"``, ``"10.0.0.7"`` or ``"10.0.0.5-10.0.0.9"`` as an interval of ``cidr``."""
    where = f"exclusion {text!r}"
    try:
        if "-" in text:
            first, last = (ipaddress.ip_address(p.strip()) for p in text.split("-", 1))
        else:
            net = ipaddress.ip_network(text.strip(), strict=True)
            first, last = net.network_address, net.broadcast_address
    except ValueError as exc:
        raise invalid(where, f"expected a CIDR, an address or a range a-b: {exc}") from None
    if first.version != cidr.version or last.version != cidr.version:
        raise invalid(where, f"not of the IP family of pool {cidr}")
    if int(first) > int(last):  # both of the pool's family (checked above)
        raise invalid(where, f"{first} is after {last}")
    if first not in cidr or last not in cidr:
        raise invalid(where, f"not inside pool {cidr}")
    return int(first), int(last)


def normalize_exclusion(text: str, cidr: IPNet) -> str:
    """The stored form: a CIDR (a single address as /32 or /128) or ``a-b``."""
    lo, hi = parse_exclusion(text, cidr)
    first, last = ipaddress.ip_address(lo), ipaddress.ip_address(hi)
    if "-" in text:
        return f"{first}-{last}" if lo != hi else f"{first}/{cidr.max_prefixlen}"
    return str(ipaddress.ip_network(text.strip()))


def parse_cidr(text: Any, what: str = "cidr") -> IPNet:
    if not isinstance(text, str) or "/" not in text:
        raise invalid(what, f"expected a CIDR like 10.244.0.0/16, got {text!r}")
    try:
        iface = ipaddress.ip_interface(text.strip())
    except ValueError as exc:
        raise invalid(what, f"{text!r} is not a CIDR: {exc}") from None
    if iface.ip != iface.network.network_address:
        raise invalid(what, f"{text} has host bits set; did you mean {iface.network}?")
    return iface.network


def calc_block_size(cidr: IPNet, requested: int | None) -> int:
    """The requested block size, or the family default narrowed to the pool; validated."""
    size = (
        requested
        if requested is not None
        else max(DEFAULT_BLOCK_SIZE[cidr.version], cidr.prefixlen)
    )
    low, high = BLOCK_SIZE_LIMITS[cidr.version]
    if isinstance(size, bool) or not isinstance(size, int) or not low <= size <= high:
        raise invalid("blockSize", f"{size!r}: IPv{cidr.version} blocks are /{low} to /{high}")
    if size < cidr.prefixlen:
        raise invalid("blockSize", f"/{size} blocks are larger than pool {cidr}")
    return size


def validate_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise invalid(
            "pool name",
            f"{name!r}: 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    return name


def parse_node_selector(items: Iterable[str]) -> dict[str, str]:
    """``["zone=a", "rack=1"]`` -> ``{"zone": "a", "rack": "1"}``."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not LABEL_KEY_RE.fullmatch(key) or not LABEL_VALUE_RE.fullmatch(value):
            raise invalid(
                f"node selector {item!r}", "expected label=value (Kubernetes label syntax)"
            )
        if key in out and out[key] != value:
            raise invalid(f"node selector {item!r}", f"label {key} is given twice")
        out[key] = value
    return out


def validate_gateway(mode: Any) -> str:
    if mode not in GATEWAY_MODES:
        raise invalid("gateway", f"{mode!r}: expected one of {', '.join(GATEWAY_MODES)}")
    return mode


def validate_reuse_delay(value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 <= value <= MAX_REUSE_DELAY
    ):
        raise invalid("reuseDelay", f"{value!r}: expected 0..{MAX_REUSE_DELAY} seconds")
    return int(value) if float(value).is_integer() else float(value)


def calc_exclusions(items: Iterable[str], cidr: IPNet) -> tuple[str, ...]:
    """Normalized, without repeats, in the order given."""
    return tuple(dict.fromkeys(normalize_exclusion(str(item), cidr) for item in items))

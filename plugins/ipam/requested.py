"""Static addresses asked for: ``IP=`` in CNI_ARGS, ``runtimeConfig.ips`` (the ``ips``
capability) and ``args.cni.ips``, each mapped to the range set it is leased from."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cni.spec.errors import InvalidConfig
from ipam.alloc.allocator import IPAddr, is_reserved_v4
from plugins.ipam.config import IpamConfig
from plugins.ipam.ranges import invalid


@dataclass(frozen=True)
class Requested:
    ip: IPAddr
    source: str  # "CNI_ARGS IP", "runtimeConfig.ips[0]", "args.cni.ips[1]"


def parse_requested_ips(
    config: Mapping[str, Any], cni_args: Mapping[str, str]
) -> tuple[Requested, ...]:
    """Static addresses asked for by `IP=` in CNI_ARGS, `runtimeConfig.ips`, `args.cni.ips`."""
    found: dict[IPAddr, Requested] = {}
    if cni_args.get("IP"):
        for text in cni_args["IP"].split(","):
            _add_requested(found, text.strip(), "CNI_ARGS IP")
    args = config.get("args")
    sources = (
        ("runtimeConfig.ips", config.get("runtimeConfig")),
        ("args.cni.ips", args.get("cni") if isinstance(args, dict) else None),
    )
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
            raise InvalidConfig(
                f"two addresses requested from range set {index}",
                f"{out[index].ip} ({out[index].source}) and {req.ip} "
                f"({req.source}); one address is leased per range set",
            )
        out[index] = req
    return {index: req.ip for index, req in out.items()}


def _set_of(cfg: IpamConfig, req: Requested) -> int:
    for index, ranges in enumerate(cfg.range_sets):
        for rng in ranges:
            if rng.contains(req.ip) and not is_reserved_v4(rng.subnet, req.ip):
                if any(r.gateway == req.ip for r in ranges):
                    raise InvalidConfig(
                        f"requested address {req.ip} ({req.source}) is a gateway",
                        f"it is the gateway of {rng.where} {rng.describe()}",
                    )
                return index
    known = "; ".join(r.describe() for ranges in cfg.range_sets for r in ranges)
    raise InvalidConfig(
        f"requested address {req.ip} ({req.source}) is outside every range", f"ranges: {known}"
    )

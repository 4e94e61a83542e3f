"""pycni-bridge's network config: parsed once into a frozen value, every key validated.

Reference `bridge` field names where the meaning is the same, so a reference netconf carries over.
An invalid value is InvalidConfig (7) naming the key; reference keys whose feature pycni does not
implement are UnsupportedField (2) when switched on; other unknown keys are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cni.spec.errors import InvalidConfig, UnsupportedField
from cni.spec.request import Request
from kernel.link import normalize_mac
from masq.rules import ifname_literal

DEFAULT_BRIDGE = "pycni0"
BOOL_KEYS = {
    "isGateway": "is_gateway",
    "isDefaultGateway": "is_default_gateway",
    "forceAddress": "force_address",
    "ipMasq": "ip_masq",
    "hairpinMode": "hairpin",
    "promiscMode": "promisc",
}
UNSUPPORTED = ("vlan", "vlanTrunk", "macspoofchk", "portIsolation", "disableContainerInterface")
DNS_LISTS = ("nameservers", "search", "options")
BACKEND_TYPES = ("vxlan", "host-gw")


@dataclass(frozen=True)
class BridgeConfig:
    bridge: str = DEFAULT_BRIDGE
    is_gateway: bool = False
    is_default_gateway: bool = False
    force_address: bool = False
    ip_masq: bool = False
    hairpin: bool = False
    promisc: bool = False
    mtu: int | None = None
    mac: str | None = None
    dns: dict = field(default_factory=dict)
    has_ipam: bool = False
    backend: str | None = None  # the netconf's backend.type (the node's must agree)


def parse_bridge_config(req: Request) -> BridgeConfig:
    conf = req.config
    flags = {attr: validate_bool(conf, key) for key, attr in BOOL_KEYS.items()}
    if flags["is_default_gateway"]:
        flags["is_gateway"] = True
    if flags["hairpin"] and flags["promisc"]:
        raise InvalidConfig(
            "invalid keys 'hairpinMode' and 'promiscMode'",
            "they are mutually exclusive: set at most one of them",
        )
    validate_unsupported(conf)
    validate_masq_backend(conf)
    bridge = validate_bridge_name(conf.get("bridge", DEFAULT_BRIDGE))
    if flags["ip_masq"]:
        ifname_literal(bridge)  # nft must be able to match it: refused before anything is made
    ipam = conf.get("ipam")
    return BridgeConfig(
        bridge=bridge,
        mtu=validate_mtu(conf.get("mtu")),
        mac=calc_mac(req),
        dns=validate_dns(conf.get("dns")),
        has_ipam=bool(ipam),
        backend=validate_backend(conf),
        **flags,
    )


def validate_bool(conf: Mapping[str, Any], key: str) -> bool:
    value = conf.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidConfig(f"invalid key {key!r}", f"expected true or false, got {value!r}")
    return value


def validate_bridge_name(name: Any) -> str:
    """A Linux interface name: 1..15 bytes of UTF-8 (IFNAMSIZ less the NUL), not '.'/'..',
    no '/', ':', whitespace or control character (the kernel would cut "a\\0b" to "a")."""
    if not isinstance(name, str) or not name:
        raise InvalidConfig("invalid key 'bridge'", f"expected an interface name, got {name!r}")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidConfig("invalid key 'bridge'", f"{name!r} is not valid Unicode") from None
    if (
        size > 15
        or name in (".", "..")
        or any(c in "/:" or c.isspace() or not c.isprintable() for c in name)
    ):
        raise InvalidConfig(
            "invalid key 'bridge'",
            f"{name!r} is not a valid interface name (at most 15 bytes, "
            "no '/', ':', whitespace or control characters)",
        )
    return name


def validate_mtu(value: Any) -> int | None:
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 68 <= value <= 65535:
        raise InvalidConfig("invalid key 'mtu'", f"expected an integer 68..65535, got {value!r}")
    return value


def validate_dns(value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidConfig("invalid key 'dns'", f"expected an object, got {value!r}")
    for key in DNS_LISTS:
        items = value.get(key)
        if items is not None and not (
            isinstance(items, list) and all(isinstance(i, str) for i in items)
        ):
            raise InvalidConfig(
                f"invalid key 'dns.{key}'", f"expected a list of strings, got {items!r}"
            )
    if value.get("domain") is not None and not isinstance(value["domain"], str):
        raise InvalidConfig(
            "invalid key 'dns.domain'", f"expected a string, got {value['domain']!r}"
        )
    return {k: value[k] for k in ("nameservers", "domain", "search", "options") if value.get(k)}


def validate_unsupported(conf: Mapping[str, Any]) -> None:
    for key in UNSUPPORTED:
        value = conf.get(key)
        if value not in (None, False, 0, [], {}):
            raise UnsupportedField(
                f"unsupported key {key!r}",
                f"pycni-bridge does not implement {key} (value {value!r})",
            )


def validate_masq_backend(conf: Mapping[str, Any]) -> None:
    backend = conf.get("ipMasqBackend")
    if backend not in (None, "nftables"):
        raise InvalidConfig(
            "invalid key 'ipMasqBackend'",
            f"pycni-bridge masquerades with nftables only, got {backend!r}",
        )


def calc_mac(req: Request) -> str | None:
    """The requested container MAC: runtimeConfig.mac > args.cni.mac > CNI_ARGS MAC=."""
    args = req.config.get("args")
    cni_args = args.get("cni") if isinstance(args, dict) else None
    for key, value in (
        ("runtimeConfig.mac", req.runtime_config.get("mac")),
        ("args.cni.mac", cni_args.get("mac") if isinstance(cni_args, dict) else None),
        ("CNI_ARGS MAC", req.env.args.get("MAC")),
    ):
        if value in (None, ""):
            continue
        mac = normalize_mac(value) if isinstance(value, str) else None
        if mac is None:
            raise InvalidConfig(f"invalid {key}", f"{value!r} is not a unicast MAC address")
        return mac
    return None


def validate_backend(conf: Mapping[str, Any]) -> str | None:
    value = conf.get("backend")
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in BACKEND_TYPES:
        raise InvalidConfig(
            "invalid key 'backend'", f'expected {{"type": "vxlan" | "host-gw"}}, got {value!r}'
        )
    return kind

"""The ``overlay`` section of pycnid's config: the node's backend and its VXLAN device.

The backend is a node setting, not a netconf one: one VXLAN device and one set of peer routes
serve every network on the node, and pycnid programs its peers at start-up, before any ADD (a
netconf is only seen when a Pod is added). A pycni-bridge netconf may name ``backend`` too; it
must then agree with the node (code 7 otherwise), so a conflist written for host-gw never runs
silently on a VXLAN node::

    "overlay": {"backend": "vxlan",            # or "host-gw"; no section: a single-node network
                "underlayAddress": "10.0.0.11", # default: nodeAddress, else the address of the
                                                # default route's device, else the source
                                                # address towards etcd
                "vni": 1, "port": 4789,         # VXLAN id and UDP port (IANA; the kernel's 8472
                "device": "pycni.1",            #   is not the default); device name
                "vtepMAC": "66:…",              # default: derived from the node name (stable)
                "mtu": 1450,                    # default: underlay MTU − 50 (IPv4) / − 70 (IPv6)
                "vtepPools": ["pods-v4"],       # pools the VTEP addresses come from (default:
                                                # every pool this node may use, one per family)
                "resyncInterval": 30,           # seconds between full resyncs
                "leaveOnStop": false}           # a graceful stop takes the node out of the overlay

Parsed once at load by ``pycnid/config.py`` into ``DaemonConfig.overlay``.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cni.spec.errors import InvalidConfig

DEFAULT_VNI = 1
DEFAULT_VXLAN_PORT = 4789
DEFAULT_RESYNC = 30.0
KNOWN = {
    "backend",
    "underlayAddress",
    "vni",
    "port",
    "device",
    "vtepMAC",
    "mtu",
    "vtepPools",
    "resyncInterval",
    "leaveOnStop",
}
BACKEND_NAMES = ("vxlan", "host-gw")


@dataclass(frozen=True)
class OverlayConfig:
    backend: str
    underlay_address: str | None = None
    vni: int = DEFAULT_VNI
    port: int = DEFAULT_VXLAN_PORT
    device: str = ""
    vtep_mac: str | None = None
    mtu: int | None = None
    vtep_pools: tuple[str, ...] = ()
    resync_interval: float = DEFAULT_RESYNC
    leave_on_stop: bool = False

    @property
    def device_name(self) -> str:
        return self.device or f"pycni.{self.vni}"


def calc_vtep_mac(node: str) -> str:
    """A stable, locally administered unicast MAC from the node name (as Calico: so a restart
    or a reboot never makes peers learn a new one)."""
    digest = hashlib.sha1(node.encode("utf-8", "surrogatepass")).digest()
    return ":".join(f"{b:02x}" for b in (0x66, *digest[:5]))


def parse_overlay_config(raw: Mapping[str, Any]) -> OverlayConfig | None:
    section = raw.get("overlay")
    if section is None:
        return None
    if not isinstance(section, dict):
        raise bad("overlay", "expected an object", section)
    unknown = sorted(set(section) - KNOWN)
    if unknown:
        raise InvalidConfig(
            f"unknown daemon config key 'overlay.{unknown[0]}'",
            f"known keys: {', '.join(sorted(KNOWN))}",
        )
    backend = section.get("backend")
    if backend not in BACKEND_NAMES:
        raise bad("overlay.backend", f"expected one of {', '.join(BACKEND_NAMES)}", backend)
    return OverlayConfig(
        backend=backend,
        underlay_address=validate_address(section.get("underlayAddress")),
        vni=validate_int(section, "vni", DEFAULT_VNI, 1, (1 << 24) - 1),
        port=validate_int(section, "port", DEFAULT_VXLAN_PORT, 1, 65535),
        device=validate_device(section.get("device")),
        vtep_mac=validate_mac(section),
        mtu=validate_optional_int(section, "mtu", 576, 65535),
        vtep_pools=validate_pools(section.get("vtepPools")),
        resync_interval=float(validate_int(section, "resyncInterval", 30, 1, 86400)),
        leave_on_stop=validate_flag(section, "leaveOnStop"),
    )


def bad(key: str, expected: str, value: Any) -> InvalidConfig:
    return InvalidConfig(f"invalid daemon config key '{key}'", f"{expected}, got {value!r}")


def validate_address(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return str(ipaddress.ip_address(value if isinstance(value, str) else ""))
    except ValueError:
        raise bad(
            "overlay.underlayAddress", "expected an IP address of this node", value
        ) from None


def validate_int(section: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = validate_optional_int(section, key, lo, hi)
    return default if value is None else value


def validate_optional_int(section: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = section.get(key)
    if value is None:  # absent or null: no value
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise bad(f"overlay.{key}", f"expected an integer {lo}..{hi}", value)
    return value


def validate_flag(section: Mapping[str, Any], key: str) -> bool:
    value = section.get(key, False)
    if not isinstance(value, bool):
        raise bad(f"overlay.{key}", "expected true or false", value)
    return value


def validate_device(value: Any) -> str:
    if value is None:
        return ""
    ok = (
        isinstance(value, str)
        and value.isprintable()
        and 0 < len(value.encode("utf-8", "replace")) <= 15
        and not any(c in "/: " for c in value)
    )
    if not ok:
        raise bad("overlay.device", "expected an interface name of at most 15 bytes", value)
    return value


def validate_mac(section: Mapping[str, Any]) -> str | None:
    value = section.get("vtepMAC")
    if value is None:
        return None
    from kernel.link import normalize_mac  # here: it loads pyroute2, which `pycni` never needs

    mac = normalize_mac(value) if isinstance(value, str) else None
    if mac is None:
        raise bad("overlay.vtepMAC", "expected a unicast MAC address", value)
    return mac


def validate_pools(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise bad("overlay.vtepPools", "expected a list of pool names", value)
    return tuple(value)

"""The node record: who a node is, and (with an overlay) how its peers reach its Pods.

Stored at ``/pycni/v1/nodes/<node>`` (no lease: a lost heartbeat never removes it)::

    {"name": "node1", "address": "172.31.250.11", "labels": {...}, "startedAt": 1.7e9,
     "overlay": {"backend": "vxlan", "underlay": "172.31.250.11", "vtepMAC": "66:..",
                 "vteps": ["10.22.0.3", "fd00:22::3"], "vni": 1, "port": 4789, "mtu": 1450}}

``overlay`` is absent on a node without one. Its blocks are not copied here: peers read them
from the affinity index. A record from a newer pycnid keeps the fields this one does not know.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from store.codec import CorruptRecord, decode, encode
from store.keys import HEARTBEATS, NODES

BACKENDS = ("vxlan", "host-gw")
MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")
VNI_MAX = 2**24 - 1


def validate_mac(text: str) -> str:
    """A VTEP's MAC: six hex octets, unicast and not zero (a peer's FDB entry is made of it)."""
    mac = text.lower()
    if not MAC.fullmatch(mac) or int(mac[:2], 16) & 1 or mac == "00:00:00:00:00:00":
        raise ValueError(f"vtepMAC {text!r} is not a unicast MAC address")
    return mac


def validate_range(name: str, value: Any, high: int) -> int:
    number = int(value or 0)
    if isinstance(value, bool) or not 0 <= number <= high:
        raise ValueError(f"{name} {value!r} is not 0-{high}")
    return number


def node_key(node: str) -> str:
    return f"{NODES}{node}"


def heartbeat_key(node: str) -> str:
    return f"{HEARTBEATS}{node}"


@dataclass(frozen=True)
class OverlayInfo:
    """What a peer needs to route to this node: its backend, underlay address and VTEP."""

    backend: str
    underlay: str
    vtep_mac: str = ""
    vteps: tuple[str, ...] = ()  # tunnel addresses, at most one per family (vxlan)
    vni: int = 0
    port: int = 0
    mtu: int = 0

    def to_dict(self) -> dict:
        return {
            "backend": self.backend,
            "underlay": self.underlay,
            "vtepMAC": self.vtep_mac,
            "vteps": list(self.vteps),
            "vni": self.vni,
            "port": self.port,
            "mtu": self.mtu,
        }

    def vtep(self, version: int) -> str | None:
        return next((v for v in self.vteps if ipaddress.ip_address(v).version == version), None)

    @classmethod
    def from_dict(cls, key: str, data: Any) -> OverlayInfo:
        try:
            if not isinstance(data, dict) or data.get("backend") not in BACKENDS:
                raise ValueError(f"backend must be one of {BACKENDS}")
            vteps = tuple(str(ipaddress.ip_address(v)) for v in data.get("vteps") or ())
            mac = data.get("vtepMAC") or ""
            return cls(
                str(data["backend"]),
                str(ipaddress.ip_address(data["underlay"])),
                validate_mac(mac) if mac else "",
                vteps,
                validate_range("vni", data.get("vni"), VNI_MAX),
                validate_range("port", data.get("port"), 65535),
                validate_range("mtu", data.get("mtu"), 65535),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptRecord(f"corrupt node record {key}", f"bad overlay: {exc}") from None


@dataclass(frozen=True)
class NodeRecord:
    name: str
    address: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    started_at: float = 0.0
    overlay: OverlayInfo | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    FIELDS = ("name", "address", "labels", "startedAt", "overlay")

    def to_bytes(self) -> bytes:
        data = {
            **self.extra,
            "name": self.name,
            "address": self.address,
            "labels": dict(self.labels),
            "startedAt": self.started_at,
        }
        if self.overlay is not None:
            data["overlay"] = self.overlay.to_dict()
        return encode(data)

    @classmethod
    def from_bytes(cls, key: str, value: bytes) -> NodeRecord:
        data = decode(key, value)
        labels = data["labels"] if isinstance(data.get("labels"), dict) else {}
        overlay = data.get("overlay")
        try:
            started = float(data.get("startedAt") or 0)
        except (TypeError, ValueError):
            raise CorruptRecord(
                f"corrupt node record {key}", "startedAt is not a number"
            ) from None
        return cls(
            str(data.get("name") or key.rsplit("/", 1)[-1]),
            str(data.get("address") or ""),
            {str(k): str(v) for k, v in labels.items()},
            started,
            OverlayInfo.from_dict(key, overlay) if overlay is not None else None,
            {k: v for k, v in data.items() if k not in cls.FIELDS},
        )

"""The ``services`` section of pycnid's config: whether this node runs the Service proxy.

``"services": {"proxy": true, "resyncInterval": 30}``: ``proxy`` turns the nftables proxy on
(off when the section or the key is absent: a node without it programs no Service table),
``resyncInterval`` is the seconds between full renders (default 30). Parsed once at load by
``pycnid/config.py``; a bad value stops pycnid from starting, naming the key (code 7). Kept
apart from ``services/proxy/setup.py`` so that reading the config does not load the proxy.

The settings kube-proxy takes per node are here too, with its names (they describe this node's
proxy; the cluster-wide service settings, ``pycni svc config``, hold what allocation needs):

- ``nodePortAddresses``: CIDRs (the node's addresses inside them answer NodePorts) or
  ``["primary"]`` (the node record's address only); absent: every global address of the node;
- ``masqueradeAll``: masquerade all traffic to a ClusterIP, whatever its source;
- ``detectLocalMode``: ``ClusterCIDR`` (default: a source in the cluster pools is local) or
  ``BridgeInterface`` (a packet coming in on a bridge named by ``detectLocal.bridgeInterface``,
  a name or a name prefix, is local, whatever its source address).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cni.spec.errors import InvalidConfig

DEFAULT_PROXY_RESYNC = 30.0
IFNAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")  # what the kernel takes (IFNAMSIZ), no quote
LOCAL_MODES = ("ClusterCIDR", "BridgeInterface")


@dataclass(frozen=True)
class ProxyConfig:
    resync_interval: float = DEFAULT_PROXY_RESYNC
    node_port_cidrs: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] | None = None
    node_port_primary: bool = False  # NodePorts on the node record's address only
    masquerade_all: bool = False
    local_bridge: str | None = None  # BridgeInterface mode: the bridge name (prefix)


def parse_proxy_config(raw: Mapping[str, Any]) -> ProxyConfig | None:
    """The proxy's settings; None when it is not on."""
    section = raw.get("services")
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise InvalidConfig("invalid key 'services': an object is expected")
    proxy = section.get("proxy", False)
    if not isinstance(proxy, bool):
        raise InvalidConfig("invalid key 'services.proxy': true or false is expected")
    interval = section.get("resyncInterval", DEFAULT_PROXY_RESYNC)
    if (
        isinstance(interval, bool)
        or not isinstance(interval, (int, float))
        or not 0 < interval < float("inf")
    ):
        raise InvalidConfig("invalid key 'services.resyncInterval': seconds > 0 are expected")
    if not proxy:
        return None
    cidrs, primary = parse_node_port_addresses(section.get("nodePortAddresses"))
    masquerade_all = section.get("masqueradeAll", False)
    if not isinstance(masquerade_all, bool):
        raise InvalidConfig("invalid key 'services.masqueradeAll': true or false is expected")
    bridge = parse_detect_local(section.get("detectLocalMode"), section.get("detectLocal"))
    return ProxyConfig(float(interval), cidrs, primary, masquerade_all, bridge)


def parse_node_port_addresses(value: Any) -> tuple[tuple | None, bool]:
    """(CIDRs or None for every address, primary only?) of ``nodePortAddresses``."""
    key = "invalid key 'services.nodePortAddresses'"
    if value is None:
        return None, False
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise InvalidConfig(f'{key}: a non-empty list of CIDRs, or ["primary"], is expected')
    if "primary" in value:
        if value != ["primary"]:
            raise InvalidConfig(f'{key}: "primary" stands alone')
        return None, True
    try:
        return tuple(ipaddress.ip_network(v) for v in value), False
    except ValueError as exc:
        raise InvalidConfig(f"{key}: {exc}") from None


def parse_detect_local(mode: Any, detail: Any) -> str | None:
    """The bridge name (prefix) under ``BridgeInterface``; None under ``ClusterCIDR``."""
    mode = "ClusterCIDR" if mode is None else mode
    if mode not in LOCAL_MODES:
        raise InvalidConfig(
            "invalid key 'services.detectLocalMode': ClusterCIDR or BridgeInterface is expected"
        )
    if detail is not None and not isinstance(detail, Mapping):
        raise InvalidConfig("invalid key 'services.detectLocal': an object is expected")
    bridge = (detail or {}).get("bridgeInterface")
    if mode == "ClusterCIDR":
        if bridge is not None:
            raise InvalidConfig(
                "invalid key 'services.detectLocal.bridgeInterface': "
                "only with detectLocalMode BridgeInterface"
            )
        return None
    if not isinstance(bridge, str) or not IFNAME.match(bridge):
        raise InvalidConfig(
            "invalid key 'services.detectLocal.bridgeInterface': an interface name "
            "(or prefix) of 1-15 letters, digits, '_', '.', '-' is expected"
        )
    return bridge


def render_proxy_settings(config: ProxyConfig) -> dict[str, Any]:
    """The ``services`` keys ``config`` was parsed from (defaults left out): what
    ``parse_proxy_config`` reads back as ``config``, ``resyncInterval`` aside."""
    doc: dict[str, Any] = {}
    if config.node_port_primary:
        doc["nodePortAddresses"] = ["primary"]
    elif config.node_port_cidrs is not None:
        doc["nodePortAddresses"] = [str(n) for n in config.node_port_cidrs]
    if config.masquerade_all:
        doc["masqueradeAll"] = True
    if config.local_bridge is not None:
        doc["detectLocalMode"] = "BridgeInterface"
        doc["detectLocal"] = {"bridgeInterface": config.local_bridge}
    return doc


DEFAULT_PROXY_CONFIG = ProxyConfig()

"""The ``services`` section of pycnid's config: whether this node runs the Service proxy.

``"services": {"proxy": true, "resyncInterval": 30}``: ``proxy`` turns the nftables proxy on
(off when the section or the key is absent: a node without it programs no Service table),
``resyncInterval`` is the seconds between full renders (default 30). Parsed once at load by
``pycnid/config.py``; a bad value stops pycnid from starting, naming the key (code 7). Kept
apart from ``services/proxy/setup.py`` so that reading the config does not load the proxy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cni.spec.errors import InvalidConfig

DEFAULT_PROXY_RESYNC = 30.0


@dataclass(frozen=True)
class ProxyConfig:
    resync_interval: float = DEFAULT_PROXY_RESYNC


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
    return ProxyConfig(float(interval)) if proxy else None

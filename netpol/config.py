"""The ``networkPolicy`` section of pycnid's config: whether this node enforces NetworkPolicy.

``"networkPolicy": {"enforce": true, "resyncInterval": 30, "existingConnections": "keep"}``:
``enforce`` turns on the
``pycni-netpol`` table (off when the section or the key is absent: the node programs nothing
and no Pod is isolated); ``resyncInterval`` is the seconds between full renders that restore
a table changed by hand (default 30); ``existingConnections``: ``keep`` (default: a policy
applies to new connections) or ``purge`` (connections it now denies are cut, ``purge.py``).
Parsed once at load by ``pycnid/config.py``; a bad value
stops pycnid from starting, naming the key (code 7). Kept apart from ``netpol/sync.py`` so that
reading the config does not load the sync.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cni.spec.errors import InvalidConfig

DEFAULT_NETPOL_RESYNC = 30.0


@dataclass(frozen=True)
class NetpolConfig:
    resync_interval: float = DEFAULT_NETPOL_RESYNC
    purge: bool = False  # existingConnections: purge


def parse_netpol_config(raw: Mapping[str, Any]) -> NetpolConfig | None:
    """The section's settings; None when enforcement is not on."""
    section = raw.get("networkPolicy")
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise InvalidConfig("invalid key 'networkPolicy': an object is expected")
    unknown = sorted(set(section) - {"enforce", "resyncInterval", "existingConnections"})
    if unknown:
        raise InvalidConfig(f"invalid key 'networkPolicy.{unknown[0]}': unknown key")
    enforce = section.get("enforce", False)
    if not isinstance(enforce, bool):
        raise InvalidConfig("invalid key 'networkPolicy.enforce': true or false is expected")
    interval = section.get("resyncInterval", DEFAULT_NETPOL_RESYNC)
    if (
        isinstance(interval, bool)
        or not isinstance(interval, (int, float))
        or not 0 < interval < float("inf")
    ):
        raise InvalidConfig("invalid key 'networkPolicy.resyncInterval': seconds > 0 are expected")
    existing = section.get("existingConnections", "keep")
    if existing not in ("keep", "purge"):
        raise InvalidConfig(
            "invalid key 'networkPolicy.existingConnections': keep or purge is expected"
        )
    return NetpolConfig(float(interval), existing == "purge") if enforce else None

"""The ``kubernetes`` section of pycnid's config: where the API server is and how to follow it.

``"kubernetes": {"kubeconfig": "/etc/pycni/kubeconfig", "resyncInterval": 300, "pageSize":
500, "watchTimeout": 300, "requestTimeout": 10}``; every key is optional. Without
``kubeconfig`` pycnid runs in-cluster: the service account's token and CA and
``KUBERNETES_SERVICE_HOST``/``PORT`` (what a DaemonSet Pod gets). With the section present the
Service proxy reads Services and EndpointSlices from the API server instead of the store;
without it nothing changes. Parsed once at load (``pycnid/config.py``); a bad value is code 7
naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cni.spec.errors import InvalidConfig

SECTION = "kubernetes"


@dataclass(frozen=True)
class KubeConfig:
    kubeconfig: str | None = None  # None: in-cluster
    resync_interval: float = 300.0  # seconds between full relists of every kind
    page_size: int = 500  # a list's ``limit``
    watch_timeout: int = 300  # a watch's ``timeoutSeconds`` (jittered down by up to a fifth)
    request_timeout: float = 10.0  # connect and read timeout of a list page


def parse_kube_config(data: dict[str, Any]) -> KubeConfig | None:
    """The section, or None when pycnid's config has none."""
    section = data.get(SECTION)
    if section is None:
        return None
    if not isinstance(section, dict):
        raise InvalidConfig(f"invalid daemon config key '{SECTION}'", "expected an object")
    unknown = sorted(set(section) - set(KEYS))
    if unknown:
        raise InvalidConfig(
            f"invalid daemon config key '{SECTION}.{unknown[0]}'",
            f"unknown key; known: {', '.join(KEYS)}",
        )
    kubeconfig = section.get("kubeconfig")
    if kubeconfig is not None and (not isinstance(kubeconfig, str) or not kubeconfig):
        raise InvalidConfig(
            f"invalid daemon config key '{SECTION}.kubeconfig'",
            f"expected a path, got {kubeconfig!r}",
        )
    return KubeConfig(
        kubeconfig=kubeconfig,
        resync_interval=_number(section, "resyncInterval", 300.0, 1.0, 86400.0),
        page_size=int(_number(section, "pageSize", 500, 1, 10000, integer=True)),
        watch_timeout=int(_number(section, "watchTimeout", 300, 1, 3600, integer=True)),
        request_timeout=_number(section, "requestTimeout", 10.0, 0.1, 600.0),
    )


KEYS = ("kubeconfig", "resyncInterval", "pageSize", "watchTimeout", "requestTimeout")


def _number(
    section: dict[str, Any],
    key: str,
    default: float,
    low: float,
    high: float,
    integer: bool = False,
) -> float:
    value = section.get(key, default)
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        raise InvalidConfig(
            f"invalid daemon config key '{SECTION}.{key}'",
            f"expected {'an integer' if integer else 'a number'} {low:g}..{high:g}, got {value!r}",
        )
    return float(value)

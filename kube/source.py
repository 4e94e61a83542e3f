"""The API server as pycnid's source: one ``Reflector`` per kind a consumer asked for.

``KubeSource(api, config, registry)`` is made once at start (pycnid/wiring.py); ``follow(kind,
sink)`` adds a kind (the Service proxy asks for Services and EndpointSlices, NetworkPolicy for
Pods, Namespaces and NetworkPolicies); ``start()`` starts every reflector, ``stop()`` stops
them. ``synced(kinds)`` is True once each was listed whole: a consumer programs nothing before
(an empty first view would remove what the kernel holds). ``status()``: per kind, listed whole
or not, answered or not, the last resourceVersion.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from common.metrics import Registry
from kube.api import Api
from kube.config import KubeConfig
from kube.kinds import Kind
from kube.reflector import KubeMetrics, Reflector, Sink


class KubeSource:
    def __init__(self, api: Api, config: KubeConfig, registry: Registry) -> None:
        self.api, self.config = api, config
        self.metrics = KubeMetrics(registry)
        self.reflectors: dict[Kind, Reflector[Any]] = {}
        self.started = False

    def follow(self, kind: Kind, sink: Sink[Any]) -> None:
        if kind in self.reflectors:
            raise ValueError(f"{kind.resource} is followed already")
        reflector = Reflector(self.api, kind, sink, self.config, self.metrics)
        self.reflectors[kind] = reflector
        if self.started:
            reflector.start()

    def start(self) -> KubeSource:
        self.started = True
        for reflector in self.reflectors.values():
            reflector.start()
        return self

    def stop(self) -> None:
        for reflector in self.reflectors.values():
            reflector.stop()

    def synced(self, kinds: Iterable[Kind]) -> bool:
        return all(k in self.reflectors and self.reflectors[k].synced for k in kinds)

    def status(self) -> dict[str, dict[str, Any]]:
        return {
            kind.resource: {"synced": r.synced, "up": r.up, "resourceVersion": r.rv}
            for kind, r in self.reflectors.items()
        }

"""The proxy fed by the API server: Services and EndpointSlices into its ``Records``.

With pycnid's ``kubernetes`` section the proxy follows two kinds through the ``KubeSource``
(``kube/source.py``) instead of the store's services and endpoints prefixes: each sink converts
an object as it arrives (``services/from_kube.py``), puts the records under keys of their own
(``KUBE_SERVICES``, ``KUBE_ENDPOINTS``: never a store key) with the proxy's lock held, and wakes
the proxy; the records dirty exactly the Services they touch, as the store's watch does. The
store still gives the cluster pools, the service settings and the node records.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from kube.kinds import ENDPOINT_SLICE, SERVICE
from kube.source import KubeSource
from services.from_kube import service_record, slice_endpoints
from services.proxy.model import IPAddress
from services.proxy.view import Records, parse_address
from services.record import EndpointRecord, ServiceRecord

KUBE_SERVICES = "k8s:services/"  # + namespace/name
KUBE_ENDPOINTS = "k8s:endpoints/"  # + namespace/slice/address
KINDS = (SERVICE, ENDPOINT_SLICE)
#: A slice's endpoints: (address, record, the address parsed) each (``SliceSink.convert``).
Endpoints = tuple[tuple[str, EndpointRecord, IPAddress], ...]


class ServiceSink:
    def __init__(self, records: Records, lock: threading.Lock, wake: threading.Event) -> None:
        self.records, self.lock, self.wake = records, lock, wake

    def convert(self, obj: Mapping[str, Any]) -> ServiceRecord | None:
        return service_record(obj)

    def replace(self, items: dict[str, ServiceRecord | None]) -> None:
        with self.lock:
            gone = [k for k in self.records.services if k.startswith(KUBE_SERVICES)]
            for key in gone:
                if key[len(KUBE_SERVICES) :] not in items:
                    self.records.put_service(key, None)
            for key, record in items.items():
                self.records.put_service(KUBE_SERVICES + key, record)
        self.wake.set()

    def apply(self, key: str, item: ServiceRecord | None) -> None:
        with self.lock:
            self.records.put_service(KUBE_SERVICES + key, item)
        self.wake.set()

    def listed(self) -> None:
        self.wake.set()  # the proxy's pass may be the first: every kind may now be synced


class SliceSink:
    """Each slice's endpoints, by address; a slice's change replaces the ones it had."""

    def __init__(self, records: Records, lock: threading.Lock, wake: threading.Event) -> None:
        self.records, self.lock, self.wake = records, lock, wake
        self.held: dict[str, tuple[str, ...]] = {}  # slice key -> its endpoint keys

    def convert(self, obj: Mapping[str, Any]) -> Endpoints:
        """A bad address skips the slice (ValueError); a good one is parsed here once and
        handed to ``Records`` with its record."""
        return tuple(
            (address, record, parse_address(address)) for address, record in slice_endpoints(obj)
        )

    def replace(self, items: dict[str, Endpoints]) -> None:
        with self.lock:
            for key in [k for k in self.held if k not in items]:
                self._put_slice(key, ())
            for key, endpoints in items.items():
                self._put_slice(key, endpoints)
        self.wake.set()

    def apply(self, key: str, item: Endpoints | None) -> None:
        with self.lock:
            self._put_slice(key, item or ())
        self.wake.set()

    def listed(self) -> None:
        self.wake.set()  # the proxy's pass may be the first: every kind may now be synced

    def _put_slice(self, key: str, endpoints: Endpoints) -> None:
        keys = tuple(f"{KUBE_ENDPOINTS}{key}/{address}" for address, _, _ in endpoints)
        for old in set(self.held.get(key, ())) - set(keys):
            self.records.put_endpoint(old, None)
        for record_key, (_, record, ip) in zip(keys, endpoints, strict=True):
            self.records.put_endpoint(record_key, record, (ip,))
        if keys:
            self.held[key] = keys
        else:
            self.held.pop(key, None)


def follow_services(
    source: KubeSource, records: Records, lock: threading.Lock, wake: threading.Event
) -> None:
    """The proxy's two kinds, each into its sink."""
    source.follow(SERVICE, ServiceSink(records, lock, wake))
    source.follow(ENDPOINT_SLICE, SliceSink(records, lock, wake))

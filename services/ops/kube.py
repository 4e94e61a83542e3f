"""What `pycni svc` reads when Services come from the Kubernetes API server (pycnid's
``kubernetes`` section): Services and EndpointSlices listed once, into the proxy's own
``Records`` through the proxy's own sinks (``services/proxy/kube_source.py``), with the pools,
service settings and node records from the store, so ``ls``, ``show``, ``endpoints`` and
``trace`` answer from exactly what the proxy programs from. Read-only: Services and their
endpoints are changed with kubectl, and the editing commands say so (``refuse_edit``).
"""

from __future__ import annotations

import threading
from typing import Any

from cni.spec.errors import InvalidConfig
from kube.api import ApiStatus, Unreachable, open_api
from kube.config import KubeConfig
from kube.kinds import ENDPOINT_SLICE, SERVICE
from kube.reflector import UNREADABLE, list_whole, object_key
from services.ops.edit import render_endpoints_doc
from services.proxy.kube_source import KUBE_SERVICES, ServiceSink, SliceSink
from services.proxy.view import PREFIXES, Records
from services.record import ServiceRecord
from services.selectors import calc_served_ports
from store.base import Store
from store.keys import ENDPOINTS, SERVICES

SOURCE = "the Kubernetes API (pycnid's kubernetes section)"


class FromKubernetes(InvalidConfig):
    """An edit refused: on this cluster Services and endpoints belong to the API server."""


def refuse_edit(what: str) -> FromKubernetes:
    return FromKubernetes(
        f"{what}: Services and their endpoints come from {SOURCE} on this node",
        "change them with kubectl; pycni svc ls/show/endpoints/trace read them",
    )


def read_kube_records(config: KubeConfig, store: Store) -> Records:
    """The proxy's inputs: both kinds listed whole from the API, the rest from the store."""
    records, lock, wake = Records(), threading.Lock(), threading.Event()
    api = open_api(config)
    for kind, sink in (
        (SERVICE, ServiceSink(records, lock, wake)),
        (ENDPOINT_SLICE, SliceSink(records, lock, wake)),
    ):
        items: dict[str, Any] = {}

        def take(page: list[Any], sink: Any = sink, items: dict[str, Any] = items) -> None:
            for obj in page:
                try:
                    items[object_key(obj)] = sink.convert(obj)
                except UNREADABLE:
                    continue  # as the proxy does: an unreadable object is left out

        try:
            list_whole(api, kind, config.page_size, take)
        except (ApiStatus, Unreachable) as exc:
            raise InvalidConfig(f"cannot list {kind.resource} from {api.host}", str(exc)) from None
        sink.replace(items)
    for prefix in PREFIXES:
        if prefix not in (SERVICES, ENDPOINTS):
            records.replace_all(store.range(prefix), prefix)
    return records


def kube_services(records: Records) -> list[ServiceRecord]:
    return [r for k, r in sorted(records.services.items()) if k.startswith(KUBE_SERVICES)]


def list_kube_services(records: Records) -> dict:
    return {
        "services": [r.to_dict() for r in kube_services(records)],
        "unreadable": [],
        "source": SOURCE,
    }


def find_service(records: Records, namespace: str, name: str) -> ServiceRecord:
    record = records.services.get(f"{KUBE_SERVICES}{namespace}/{name}")
    if record is None:
        raise InvalidConfig(
            f"no Service {namespace}/{name} in {SOURCE}",
            "headless and ExternalName Services are not the proxy's",
        )
    return record


def show_kube(records: Records, namespace: str, name: str) -> dict:
    record = find_service(records, namespace, name)
    return {
        "service": record.to_dict(),
        "endpointCount": len(records.selected(record)),
        "source": SOURCE,
    }


def kube_endpoints(records: Records, namespace: str, name: str) -> dict:
    record = find_service(records, namespace, name)
    found = [(e, calc_served_ports(record, e)) for e, _ in records.selected(record)]
    return {**render_endpoints_doc(record, found), "source": SOURCE}

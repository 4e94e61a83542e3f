"""`pycni svc endpoint set|drain`: an endpoint's conditions changed in the store (one CAS each).

An endpoint record (``services.record.EndpointRecord``) carries Kubernetes' three conditions,
``ready``, ``serving`` and ``terminating``; pycni-svc publishes ready and serving. ``set``
changes the ones it names; ``drain`` is what a graceful termination marks before the Pod goes
(not ready, still serving, terminating), so the proxy sends it no new connection while a
ready endpoint is left and keeps it as the fallback while none is (``select_backends`` in
``services.proxy.model``); pycni-svc's DEL then removes the record. Each record is rewritten
compared at the revision read, keeping every other field (and the ones it does not know).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from cni.spec.errors import InvalidConfig, TryAgainLater
from services.record import EndpointRecord, endpoints_prefix
from store.base import Compare, Put, Store
from store.cas import LOST, Lost, Retry, run_cas
from store.keys import ENDPOINTS

RETRY = Retry(attempts=12, base=0.005, cap=0.2, jitter=True, immediate=1)
DRAINED = {"ready": False, "serving": True, "terminating": True}


def validate_conditions(changes: Mapping[str, object]) -> dict[str, bool]:
    """The conditions a command names: at least one, each true or false."""
    for name, value in changes.items():
        if name not in EndpointRecord.CONDITIONS:
            raise InvalidConfig(
                f"invalid endpoint condition {name}: not one of ready, serving, terminating"
            )
        if not isinstance(value, bool):
            raise InvalidConfig(
                f"invalid endpoint condition {name}: {value!r} is not true or false"
            )
    if not changes:
        raise InvalidConfig(
            "no endpoint condition given",
            "name one: --[not-]ready, --[not-]serving, --[not-]terminating",
        )
    return {str(k): bool(v) for k, v in changes.items()}


def find_endpoint_keys(store: Store, namespace: str, pod: str, ifname: str | None) -> list[str]:
    """The Pod's endpoint keys: the one of ``ifname``, or every attachment's."""
    prefix = f"{endpoints_prefix(namespace)}{pod}/"
    keys = [kv.key for kv in store.range(prefix) if ifname in (None, kv.key[len(prefix) :])]
    if not keys:
        where = f" on {ifname}" if ifname is not None else ""
        raise InvalidConfig(f"no endpoint of Pod {namespace}/{pod}{where}")
    return keys


def ensure_conditions(store: Store, key: str, changes: Mapping[str, bool]) -> EndpointRecord:
    """The record at ``key`` with ``changes`` written over its conditions (CAS)."""

    def attempt() -> EndpointRecord | Lost:
        kv = store.get(key)
        if kv is None:
            raise InvalidConfig(f"no endpoint {key.removeprefix(ENDPOINTS)}")
        old = EndpointRecord.from_bytes(kv.key, kv.value)
        new = replace(
            old,
            ready=changes.get("ready", old.ready),
            serving=changes.get("serving", old.serving),
            terminating=changes.get("terminating", old.terminating),
        )
        if new.to_bytes() == kv.value:
            return new
        done = store.txn([Compare(key, kv.mod_revision)], [Put(key, new.to_bytes())])
        return new if done.succeeded else LOST

    busy = TryAgainLater(f"could not change {key}: the store kept changing", "run it again")
    return run_cas(attempt, RETRY, busy)


def set_conditions(
    store: Store, namespace: str, pod: str, ifname: str | None, changes: Mapping[str, object]
) -> dict:
    """Change the named conditions of the Pod's endpoint(s); the records as written."""
    wanted = validate_conditions(changes)
    keys = find_endpoint_keys(store, namespace, pod, ifname)
    return {"endpoints": [render_endpoint(ensure_conditions(store, k, wanted)) for k in keys]}


def drain(store: Store, namespace: str, pod: str, ifname: str | None) -> dict:
    """Mark the Pod's endpoint(s) terminating: not ready, still serving."""
    return set_conditions(store, namespace, pod, ifname, DRAINED)


def render_endpoint(e: EndpointRecord) -> dict:
    return {
        "namespace": e.namespace,
        "pod": e.pod,
        "ifname": e.ifname,
        "ips": list(e.ips),
        "node": e.node,
        "ready": e.ready,
        "serving": e.serving,
        "terminating": e.terminating,
    }

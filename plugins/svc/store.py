"""pycni-svc's writes: an endpoint record published, withdrawn, collected (every one CAS).

An endpoint key is the Pod's (``endpoints/<ns>/<pod>/<ifname>``), but a record belongs to the
attachment that wrote it (network, containerID, ifname): a Pod recreated under the same name
(a StatefulSet's) overwrites the key with its own attachment, and the old sandbox's late DEL
then finds another attachment's record there and leaves it. Each write compares the key at
the revision read, so a DEL never removes a record an ADD wrote after it looked. A record is
published ready and serving; a repeated ADD keeps the conditions the CLI gave its
attachment's record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace

from cni.spec.errors import TryAgainLater
from services.record import EndpointRecord
from store.base import KV, Compare, Delete, Put, Store
from store.cas import LOST, Lost, Retry, run_cas
from store.codec import CorruptRecord
from store.keys import ENDPOINTS

log = logging.getLogger("pycnid.svc")
RETRY = Retry(attempts=12, base=0.005, cap=0.2, jitter=True, immediate=1)
Attachment = tuple[str, str, str]  # (network, containerID, ifname)


def attachment_of(record: EndpointRecord) -> Attachment:
    return record.network, record.container_id, record.ifname


def decode_endpoint(kv: KV) -> EndpointRecord | None:
    """The record at ``kv`` (None, logged, when it is corrupt: nobody's to remove)."""
    try:
        return EndpointRecord.from_bytes(kv.key, kv.value)
    except CorruptRecord as err:
        log.warning("skipping %s: %s", kv.key, err)
        return None


def lost_race(what: str) -> TryAgainLater:
    return TryAgainLater(f"could not {what}: the store kept changing", "retry the request")


def ensure_published(store: Store, record: EndpointRecord) -> None:
    """Write ``record`` at its key unless it is there already (a repeated ADD)."""

    def attempt() -> None | Lost:
        kv = store.get(record.key)
        wanted = calc_kept_conditions(record, decode_endpoint(kv) if kv is not None else None)
        if kv is not None and kv.value == wanted.to_bytes():
            return None
        revision = kv.mod_revision if kv is not None else 0
        done = store.txn([Compare(record.key, revision)], [Put(record.key, wanted.to_bytes())])
        return None if done.succeeded else LOST

    run_cas(attempt, RETRY, lost_race(f"publish endpoint {record.key}"))


def calc_kept_conditions(record: EndpointRecord, stored: EndpointRecord | None) -> EndpointRecord:
    """``record`` with the conditions ``pycni svc endpoint set|drain`` gave the stored record
    of the same attachment: a repeated ADD does not make a drained Pod ready again. A new
    attachment (another sandbox under the Pod's name) starts ready and serving."""
    if stored is None or attachment_of(stored) != attachment_of(record):
        return record
    return replace(
        record, ready=stored.ready, serving=stored.serving, terminating=stored.terminating
    )


def withdraw(store: Store, key: str, owned: Callable[[EndpointRecord], bool]) -> bool:
    """Delete the record at ``key`` if ``owned`` says it is ours; True when one went."""

    def attempt() -> bool | Lost:
        kv = store.get(key)
        record = decode_endpoint(kv) if kv is not None else None
        if kv is None or record is None or not owned(record):
            return False
        done = store.txn([Compare(key, kv.mod_revision)], [Delete(key)])
        return True if done.succeeded else LOST

    return run_cas(attempt, RETRY, lost_race(f"withdraw endpoint {key}"))


def find_keys(store: Store, owned: Callable[[EndpointRecord], bool]) -> list[str]:
    """Keys of every endpoint record ``owned`` picks (a scan of the endpoints prefix)."""
    records = (decode_endpoint(kv) for kv in store.range(ENDPOINTS))
    return [r.key for r in records if r is not None and owned(r)]


def withdraw_all(
    store: Store, keys: Iterable[str], owned: Callable[[EndpointRecord], bool]
) -> list[str]:
    """Withdraw each key still ``owned`` at its own CAS; the keys that went."""
    return [key for key in keys if withdraw(store, key, owned)]

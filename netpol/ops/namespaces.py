"""`pycni ns label|ls|show`: namespaces' labels, which namespaceSelectors match.

``label`` takes kubectl's syntax: ``key=value`` sets (changing a label that has another value
needs ``overwrite``, as kubectl's ``--overwrite``), ``key-`` removes (a label that is not there
is reported, not an error). Keys and values are validated as the API server validates labels;
``kubernetes.io/metadata.name`` is the namespace's name on every namespace and cannot be set or
removed. The record is written in one txn compared at the revision read.
"""

from __future__ import annotations

from collections.abc import Iterable

from cni.spec.errors import InvalidConfig, TryAgainLater
from netpol.record import (
    NAME_LABEL,
    NamespaceRecord,
    label_problem,
    read_endpoints,
    read_namespaces,
    read_policies,
)
from services.validate import DNS_LABEL
from store.base import Compare, Put, Store
from store.cas import LOST, Lost, Retry, run_cas
from store.keys import namespace_key

RETRY = Retry(attempts=8, base=0.005, cap=0.2, jitter=True, immediate=1)


def parse_changes(changes: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """(labels to set, keys to remove) of ``key=value`` and ``key-`` arguments."""
    sets: dict[str, str] = {}
    removes: list[str] = []
    for text in changes:
        key, eq, value = text.partition("=")
        if not eq and text.endswith("-"):
            key = text[:-1]
        elif not eq:
            raise InvalidConfig(f"invalid label {text!r}: expected key=value or key-")
        why = label_problem(key, value if eq else "")
        if why:
            raise InvalidConfig(f"invalid label {text!r}: {why}")
        if key == NAME_LABEL:
            raise InvalidConfig(f"invalid label {text!r}: {NAME_LABEL} is the namespace's name")
        if key in sets or key in removes:
            raise InvalidConfig(f"invalid label {text!r}: {key} is given twice")
        if eq:
            sets[key] = value
        else:
            removes.append(key)
    return sets, removes


def check_name(namespace: str) -> str:
    if not DNS_LABEL.fullmatch(namespace):
        raise InvalidConfig(
            f"invalid namespace {namespace!r}: not a DNS label (a-z, 0-9, '-', at most 63)"
        )
    return namespace


def label(store: Store, namespace: str, changes: Iterable[str], overwrite: bool = False) -> dict:
    check_name(namespace)
    sets, removes = parse_changes(changes)
    key = namespace_key(namespace)

    def attempt() -> dict | Lost:
        kv = store.get(key)
        old = NamespaceRecord.from_kv(kv) if kv else NamespaceRecord(namespace)
        for name, value in sets.items():
            if not overwrite and old.labels.get(name, value) != value:
                raise InvalidConfig(
                    f"label {name} of namespace {namespace} is {old.labels[name]!r}: "
                    "pass --overwrite to change it"
                )
        labels = {k: v for k, v in {**old.labels, **sets}.items() if k not in removes}
        new = NamespaceRecord(namespace, labels, old.extra)
        if kv is None or kv.value != new.to_bytes():
            done = store.txn(
                [Compare(key, kv.mod_revision if kv else 0)], [Put(key, new.to_bytes())]
            )
            if not done.succeeded:
                return LOST
        return {
            **namespace_doc(namespace, labels),
            "notFound": [k for k in removes if k not in old.labels],
        }

    return run_cas(attempt, RETRY, TryAgainLater(f"namespace {namespace} kept changing"))


def namespace_doc(namespace: str, labels: dict[str, str]) -> dict:
    return {"namespace": namespace, "labels": {**labels, NAME_LABEL: namespace}}


def list_namespaces(store: Store) -> dict:
    """Every namespace with a record, a Pod or a policy: its labels (the name label too) and
    how many Pods and policies it holds."""
    records, bad = read_namespaces(store)
    endpoints, bad_endpoints = read_endpoints(store)
    policies, bad_policies = read_policies(store)
    labels = {r.name: dict(r.labels) for r in records}
    pods = {(e.namespace, e.pod) for e in endpoints}
    names = sorted({*labels, *(ns for ns, _ in pods), *(p.namespace for p in policies)})
    return {
        "namespaces": [
            {
                **namespace_doc(ns, labels.get(ns, {})),
                "pods": sum(1 for pod_ns, _ in pods if pod_ns == ns),
                "policies": sum(1 for p in policies if p.namespace == ns),
            }
            for ns in names
        ],
        "unreadable": [*bad, *bad_endpoints, *bad_policies],
    }


def show_namespace(store: Store, namespace: str) -> dict:
    check_name(namespace)
    kv = store.get(namespace_key(namespace))
    record = NamespaceRecord.from_kv(kv) if kv else NamespaceRecord(namespace)
    endpoints, _ = read_endpoints(store)
    policies, _ = read_policies(store, namespace)
    return {
        **namespace_doc(namespace, dict(record.labels)),
        "stored": kv is not None,
        "pods": sorted({e.pod for e in endpoints if e.namespace == namespace}),
        "policies": [p.ref for p in policies],
    }

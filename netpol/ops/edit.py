"""`pycni netpol apply|rm|ls|show`: NetworkPolicy manifests into the store and back.

``apply`` validates every object of the file as the API server would (``parse_policy``: errors
name the file, the document and the field path) before it writes anything, then writes all of
them in one txn, each key compared at the revision read (a concurrent writer makes it read and
plan again). Each object is ``created``, ``configured`` (the stored one differed) or
``unchanged``, as kubectl reports. A manifest without ``metadata.namespace`` goes to
``namespace`` ("default" when not given); one naming another namespace than a given
``namespace`` is refused, as kubectl refuses it.

Every document returned is what ``--output json`` prints.
"""

from __future__ import annotations

from cni.spec.errors import CNIError, InvalidConfig, TryAgainLater
from netpol.ops.describe import describe_policy, selector_text
from netpol.ops.manifest import Document, load_documents
from netpol.policy import NetworkPolicy, parse_policy
from netpol.record import decode_policy, encode_policy, read_policies
from services.validate import DNS_LABEL
from store.base import Compare, Delete, Put, Store
from store.cas import LOST, Lost, Retry, run_cas
from store.keys import netpol_key

RETRY = Retry(attempts=8, base=0.005, cap=0.2, jitter=True, immediate=1)
DEFAULT_NAMESPACE = "default"


def parse_document(doc: Document, namespace: str | None) -> NetworkPolicy:
    manifest = doc.manifest
    given = manifest.get("metadata") if isinstance(manifest, dict) else None
    stated = given.get("namespace") if isinstance(given, dict) else None
    if namespace and stated and stated != namespace:
        raise InvalidConfig(
            f"{doc.where}: metadata.namespace {stated!r} does not match --namespace "
            f"{namespace!r} (pass --namespace {stated} or leave it out)"
        )
    try:
        policy = parse_policy(manifest, namespace or DEFAULT_NAMESPACE)
    except CNIError as exc:
        raise InvalidConfig(f"{doc.where}: {exc.msg}", exc.details) from None
    for path, value in (("metadata.namespace", policy.namespace), ("metadata.name", policy.name)):
        if not DNS_LABEL.fullmatch(value):  # parse_policy's check lets a trailing newline by
            raise InvalidConfig(f"{doc.where}: invalid NetworkPolicy field {path}: {value!r}")
    return policy


def parse_file(text: str, source: str, namespace: str | None) -> list[NetworkPolicy]:
    """Every policy of the file, validated; the same namespace/name twice is refused."""
    policies: dict[str, tuple[str, NetworkPolicy]] = {}
    for doc in load_documents(text, source):
        policy = parse_document(doc, namespace)
        if policy.ref in policies:
            first = policies[policy.ref][0]
            raise InvalidConfig(f"{doc.where}: NetworkPolicy {policy.ref} is also in {first}")
        policies[policy.ref] = (doc.where, policy)
    return [policy for _, policy in policies.values()]


def apply(store: Store, text: str, source: str, namespace: str | None = None) -> dict:
    policies = parse_file(text, source, namespace)

    def attempt() -> list[dict] | Lost:
        compares, puts, results = [], [], []
        for policy in policies:
            key, value = netpol_key(policy.namespace, policy.name), encode_policy(policy)
            kv = store.get(key)
            compares.append(Compare(key, kv.mod_revision if kv else 0))
            result = (
                "created" if kv is None else "unchanged" if kv.value == value else "configured"
            )
            if result != "unchanged":
                puts.append(Put(key, value))
            results.append({"policy": policy.ref, "result": result})
        if puts and not store.txn(compares, puts).succeeded:
            return LOST
        return results

    busy = TryAgainLater("NetworkPolicies kept changing while applying: try again")
    return {"applied": run_cas(attempt, RETRY, busy)}


def remove(store: Store, namespace: str, name: str) -> dict:
    key = netpol_key(namespace, name)

    def attempt() -> dict | Lost:
        kv = store.get(key)
        if kv is None:
            raise InvalidConfig(f"no NetworkPolicy {namespace}/{name}")
        done = store.txn([Compare(key, kv.mod_revision)], [Delete(key)])
        return {"removed": f"{namespace}/{name}"} if done.succeeded else LOST

    return run_cas(
        attempt, RETRY, TryAgainLater(f"NetworkPolicy {namespace}/{name} kept changing")
    )


def list_policies(store: Store, namespace: str | None = None) -> dict:
    policies, unreadable = read_policies(store, namespace)
    return {"policies": [list_row(p) for p in policies], "unreadable": unreadable}


def list_row(policy: NetworkPolicy) -> dict:
    return {
        "namespace": policy.namespace,
        "name": policy.name,
        "podSelector": selector_text(policy.pod_selector) or "<none>",
        "policyTypes": list(policy.policy_types),
    }


def show(store: Store, namespace: str, name: str) -> dict:
    """The manifest as stored (a corrupt record is an error naming its key: ``rm`` removes
    it)."""
    kv = store.get(netpol_key(namespace, name))
    if kv is None:
        raise InvalidConfig(f"no NetworkPolicy {namespace}/{name}")
    return decode_policy(kv).to_dict()


def describe(store: Store, namespace: str, name: str) -> dict:
    kv = store.get(netpol_key(namespace, name))
    if kv is None:
        raise InvalidConfig(f"no NetworkPolicy {namespace}/{name}")
    return describe_policy(decode_policy(kv))

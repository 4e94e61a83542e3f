"""The store records the NetworkPolicy sync reads, kept current as ``PolicyInputs``.

``Records`` is the view ``store/watched.py`` keeps current from ``PREFIXES``: policies,
namespaces' labels, the Pods (endpoint records) and the node records, each read as
``netpol/record.py`` reads it (the one owner of those records: ``pycni netpol trace`` sees the
same model), and turned into ``evaluate.PolicyInputs`` when a pass asks. A Pod without an
endpoint record (no pycni-svc in its conflist) is neither isolated nor a peer. An unreadable
record is logged once and left out; the others still apply.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from cni.spec.errors import CNIError
from common.skipped import Skipped
from netpol.evaluate import PodInfo, PolicyInputs, policies_of
from netpol.members import KeyedOrder
from netpol.policy import NetworkPolicy
from netpol.record import NamespaceRecord, calc_node_ips, calc_pod, decode_policy
from nodes.record import NodeRecord
from services.record import EndpointRecord
from store.base import KV
from store.codec import CorruptRecord
from store.keys import ENDPOINTS, NAMESPACES, NETPOLS, NODES

log = logging.getLogger("pycnid.netpol")
PREFIXES = (NETPOLS, NAMESPACES, ENDPOINTS, NODES)


class Records:
    def __init__(self) -> None:
        self.policies: dict[str, NetworkPolicy] = {}
        self.namespaces: dict[str, NamespaceRecord] = {}
        self.endpoints: dict[str, EndpointRecord] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.bad = Skipped("netpol", log)
        self.version = 0  # bumped by every change: the sync renders when it moved
        self.pods = PodCache()
        self.touched: set[str] = set()  # endpoint keys put or deleted since the last inputs()
        self.by_policy: PolicyInputs | None = None  # the policies alone, sorted; None: stale
        self.policy_order = KeyedOrder[str, NetworkPolicy]()  # by ref and by namespace
        self.policy_keys: set[str] = set()  # policy keys put or deleted since it followed
        self.labels: dict[str, dict[str, str]] | None = None  # by namespace; None: stale

    def replace_all(self, kvs: Iterable[KV], prefix: str) -> None:
        present: set[str] = set()
        for kv in kvs:
            present.add(kv.key)
            self.apply(kv)
        for table in self._tables():
            for key in [k for k in table if k.startswith(prefix) and k not in present]:
                del table[key]
                self._touch(key)
        self.bad.keep_only(prefix, present)

    def apply(self, kv: KV, deleted: bool = False) -> bool:
        before = self.version
        try:
            self._apply(kv, deleted)
            self.bad.clear(kv.key)
        except (CNIError, ValueError) as exc:
            self._forget(kv.key)
            self.bad.note(kv.key, getattr(exc, "msg", exc))
        return self.version != before

    def _apply(self, kv: KV, deleted: bool) -> None:
        if deleted:
            return self._forget(kv.key)
        table, value = self._parse(kv)
        if table.get(kv.key) != value:
            table[kv.key] = value
            self._touch(kv.key)
        return None

    def _parse(self, kv: KV) -> tuple[dict, object]:
        if kv.key.startswith(NETPOLS):
            return self.policies, decode_policy(kv)
        if kv.key.startswith(NAMESPACES):
            return self.namespaces, NamespaceRecord.from_kv(kv)
        if kv.key.startswith(ENDPOINTS):
            return self.endpoints, EndpointRecord.from_bytes(kv.key, kv.value)
        if kv.key.startswith(NODES):
            return self.nodes, NodeRecord.from_bytes(kv.key, kv.value)
        raise CorruptRecord(f"unexpected key {kv.key}", "not a NetworkPolicy input")

    def _forget(self, key: str) -> None:
        for table in self._tables():
            if table.pop(key, None) is not None:
                self._touch(key)

    def _touch(self, key: str) -> None:
        """``key`` was put or deleted: a change for the next pass."""
        self.touched.add(key)
        if key.startswith(NETPOLS):
            self.by_policy = None
            self.policy_keys.add(key)
        elif key.startswith(NAMESPACES):
            self.labels = None
        self.version += 1

    def _tables(self) -> tuple[dict, ...]:
        return (self.policies, self.namespaces, self.endpoints, self.nodes)

    def pod_of(self, key: str) -> PodInfo | None:
        """The Pod of the endpoint record ``key`` alone (None: not held, e.g. unreadable)."""
        record = self.endpoints.get(key)
        return calc_pod([record]) if record is not None else None

    def policy_inputs(self) -> PolicyInputs:
        """The policies alone, sorted by ref and by namespace: the changed ones moved after a
        policy changed (a namespace whose policies did not keeps its tuple), and shared by
        every pass and every ``isolating`` until then."""
        if self.by_policy is None:
            order = self.policy_order
            order.follow(self.policies, self.policy_keys)
            self.policy_keys = set()
            self.by_policy = PolicyInputs(policies=order.sorted, policy_groups=order.groups)
        return self.by_policy

    def isolating(self, pod: PodInfo) -> dict[str, list[NetworkPolicy]]:
        """Direction -> the policies isolating ``pod`` there, sorted as a pass sorts them."""
        policies = self.policy_inputs()
        return {d: policies_of(policies, pod, d) for d in ("Ingress", "Egress")}

    def namespace_labels(self) -> dict[str, dict[str, str]]:
        """The namespaces' labels, one mapping shared by every pass until a namespace changed
        (a pass compares them with the last pass's: the same object is at once the same)."""
        if self.labels is None:
            self.labels = {n.name: dict(n.labels) for n in self.namespaces.values()}
        return self.labels

    def inputs(self) -> PolicyInputs:
        touched, self.touched = self.touched, set()
        policies = self.policy_inputs()
        return PolicyInputs(
            self.pods.refresh(self.endpoints, touched),
            self.namespace_labels(),
            policies.policies,
            calc_node_ips(self.nodes.values()),
            groups=self.pods.groups,
            policy_groups=policies.policy_groups,
        )


Group = tuple[str, str]  # a Pod: namespace, name


class PodCache:
    """The Pods of the endpoint records, each recomputed only when one of its records changed
    (a pass at 10,000 Pods spent 0.5 s turning every record into a ``PodInfo`` again). A
    Pod's records are taken in key order, as ``netpol/record.py`` reads them from the store."""

    def __init__(self) -> None:
        self.seen: dict[str, EndpointRecord] = {}
        #: each Pod's record keys, sorted (``keys_of``): the key itself for a Pod of one record
        #: (10,000 sets of one key held ~2 MiB, tuples of one 0.5 MiB)
        self.keys: dict[Group, str | tuple[str, ...]] = {}
        self.order = KeyedOrder[Group, PodInfo]()  # each Pod by ref and by namespace

    @property
    def sorted(self) -> Sequence[PodInfo]:
        return self.order.sorted

    @property
    def groups(self) -> dict[str, tuple[PodInfo, ...]]:
        return self.order.groups

    def refresh(
        self, endpoints: dict[str, EndpointRecord], touched: Iterable[str] | None = None
    ) -> Sequence[PodInfo]:
        """``touched``: the keys put or deleted since the last refresh (None: look at every
        key; the comparison of 10,000 keys was tens of ms of every pass)."""
        stale: set[Group] = set()
        for key in endpoints.keys() | self.seen.keys() if touched is None else touched:
            old, new = self.seen.get(key), endpoints.get(key)
            if old is new:
                continue
            if old is not None:
                group = (old.namespace, old.pod)
                stale.add(group)
                self.set_keys(group, [k for k in self.keys_of(group) if k != key])
            if new is not None:
                group = (new.namespace, new.pod)
                stale.add(group)
                self.set_keys(group, sorted({*self.keys_of(group), key}))
                self.seen[key] = new
            else:
                del self.seen[key]
        pods: dict[Group, PodInfo | None] = {}
        for group in stale:
            keys = self.keys_of(group)
            if keys:
                pods[group] = calc_pod([endpoints[k] for k in keys])
            else:
                self.keys.pop(group, None)
                pods[group] = None
        self.order.follow(pods, stale)
        return self.sorted

    def keys_of(self, group: Group) -> tuple[str, ...]:
        held = self.keys.get(group, ())
        return (held,) if isinstance(held, str) else held

    def set_keys(self, group: Group, keys: list[str]) -> None:
        self.keys[group] = keys[0] if len(keys) == 1 else tuple(keys)

"""Pods, Namespaces and NetworkPolicies from the API server as the policy model's inputs.

``PolicyObjects`` is the sink of three reflectors (``kube/reflector.py``): it converts each
object as it arrives and keeps the result, and ``inputs(node_ips)`` gives the
``PolicyInputs`` of the moment. What a Pod contributes is what NetworkPolicy reads of it: its
namespace and name, its addresses (``status.podIPs``), labels, node and named container ports
with their protocol; a hostNetwork Pod (its addresses are its node's) and a Pod that has ended
(Succeeded, Failed) or has no address yet are no peer and are not isolated, as in the
upstream implementations. A Pod without an address is kept all the same (``PodObject``): this
node's ADD may attach its addresses before kubelet writes them (``attach``, ``wait_pod``; the
join is ``netpol/attached.py``). A NetworkPolicy is parsed as ``pycni netpol apply`` parses a
manifest (``netpol/policy.py``): one the API server took but this parser refuses is logged
once by the reflector and left out. A Namespace gives its labels.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from cni.spec.errors import InvalidConfig
from kube.fields import section
from kube.kinds import NAMESPACE, NETWORK_POLICY, POD, Kind
from kube.source import KubeSource
from netpol.attached import AttachedPod, PodObject, calc_pod
from netpol.evaluate import NamedPort, PodInfo, PolicyInputs
from netpol.members import KeyedOrder
from netpol.policy import API_VERSION, KIND, NetworkPolicy, parse_policy

ENDED = ("Succeeded", "Failed")
KINDS = (POD, NAMESPACE, NETWORK_POLICY)
T = TypeVar("T")


def pod_info(obj: Mapping[str, Any]) -> PodInfo | None:
    """What policies read of a Pod (None: it takes no part)."""
    found = pod_object(obj)
    return found.info if found and not found.ended and found.info.ips else None


def pod_object(obj: Mapping[str, Any]) -> PodObject | None:
    """A Pod as kept, with or without addresses (None: hostNetwork, never a Pod of ours)."""
    meta, spec, status = (section(obj, k) for k in ("metadata", "spec", "status"))
    ips = tuple(
        str(i["ip"]) for i in status.get("podIPs") or () if isinstance(i, dict) and i.get("ip")
    )
    ips = ips or ((str(status["podIP"]),) if status.get("podIP") else ())
    if spec.get("hostNetwork"):
        return None
    ports = tuple(
        NamedPort(str(p["name"]), str(p.get("protocol") or "TCP"), int(p["containerPort"]))
        for c in (spec.get("containers") or [])
        if isinstance(c, dict)
        for p in (c.get("ports") or [])
        if isinstance(p, dict) and p.get("name") and p.get("containerPort")
    )
    info = PodInfo(
        str(meta["namespace"]),
        str(meta["name"]),
        ips,
        {str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        str(spec.get("nodeName") or ""),
        ports,
    )
    return PodObject(info, str(meta.get("uid") or ""), status.get("phase") in ENDED)


def namespace_labels(obj: Mapping[str, Any]) -> dict[str, str]:
    meta = section(obj, "metadata")
    return {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}


def network_policy(obj: Mapping[str, Any]) -> NetworkPolicy:
    """Items of a list come without apiVersion and kind (as the API server sends them)."""
    meta = section(obj, "metadata")
    manifest = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
        "spec": obj.get("spec"),
    }
    try:
        return parse_policy(manifest)
    except InvalidConfig as exc:  # taken by the API server, refused here: left out, logged
        raise ValueError(exc.msg) from None


class Kept(Generic[T]):
    """One kind's converted objects by key; ``on_change`` after every change, and the keys
    changed since ``take_touched`` (None: every key, after a list replaced them all)."""

    def __init__(
        self,
        convert: Callable[[Mapping[str, Any]], T],
        lock: threading.Lock,
        on_change: Callable[[], None],
    ) -> None:
        self.convert_fn, self.lock, self.on_change = convert, lock, on_change
        self.items: dict[str, T] = {}
        self.touched: set[str] | None = None

    def convert(self, obj: Mapping[str, Any]) -> T:
        return self.convert_fn(obj)

    def replace(self, items: dict[str, T]) -> None:
        with self.lock:
            self.items = dict(items)
            self.touched = None
        self.on_change()

    def apply(self, key: str, item: T | None) -> None:
        with self.lock:
            if item is None:
                self.items.pop(key, None)
            else:
                self.items[key] = item
            if self.touched is not None:
                self.touched.add(key)
        self.on_change()

    def listed(self) -> None:
        self.on_change()  # every kind may now be synced: the pass and ``wait_pod`` look again

    def take_touched(self) -> set[str] | None:
        """Under the lock: the keys changed since the last call (None: every one)."""
        touched, self.touched = self.touched, set()
        return touched


class PolicyObjects:
    """The three kinds NetworkPolicy reads, followed through ``source``, and this node's
    attached Pods laid over them (keyed by attachment)."""

    def __init__(self, source: KubeSource, on_change: Callable[[], None]) -> None:
        self.source, self.lock = source, threading.Lock()
        self.arrived = threading.Condition()  # notified on every change: ``wait_pod``
        self.on_change = on_change
        self.attached: dict[str, AttachedPod] = {}
        self.attached_touched: set[str] = set()  # refs of Pods attached or detached since
        self.order = KeyedOrder[str, PodInfo]()  # each Pod object joined with its attachments
        self.policy_order = KeyedOrder[str, NetworkPolicy]()
        self.labels: dict[str, dict[str, str]] = {}
        self.pods: Kept[PodObject | None] = Kept(pod_object, self.lock, self.changed)
        self.namespaces: Kept[dict[str, str]] = Kept(namespace_labels, self.lock, self.changed)
        self.policies: Kept[NetworkPolicy] = Kept(network_policy, self.lock, self.changed)
        kept: dict[Kind, Kept[Any]] = {
            POD: self.pods,
            NAMESPACE: self.namespaces,
            NETWORK_POLICY: self.policies,
        }
        for kind, sink in kept.items():
            source.follow(kind, sink)

    def changed(self) -> None:
        with self.arrived:
            self.arrived.notify_all()
        self.on_change()

    def synced(self) -> bool:
        return self.source.synced(KINDS)

    def wait_pod(self, pod: AttachedPod, timeout: float) -> bool:
        """True once the three kinds were listed whole and the object of ``pod`` is there
        (False after ``timeout``). ``arrived`` is notified on every change and when a kind
        becomes listed (``Kept.listed``)."""
        deadline = time.monotonic() + timeout
        with self.arrived:
            while not (self.synced() and self.knows(pod)):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.arrived.wait(left)
        return True

    def knows(self, pod: AttachedPod) -> bool:
        with self.lock:
            obj = self.pods.items.get(pod.ref)
        return obj is not None and pod.is_of(obj)

    def attach(self, key: str, pod: AttachedPod) -> None:
        self.attach_all({key: pod})

    def attach_all(self, found: Mapping[str, AttachedPod]) -> None:
        with self.lock:
            for key, pod in found.items():
                before = self.attached.get(key)
                self.attached_touched |= {pod.ref, *([before.ref] if before else [])}
                self.attached[key] = pod
        self.on_change()

    def detach(self, key: str) -> bool:
        """Forget the attachment ``key``; True when there was one."""
        with self.lock:
            gone = self.attached.pop(key, None)
            if gone is not None:
                self.attached_touched.add(gone.ref)
        if gone is not None:
            self.on_change()
        return gone is not None

    def inputs(self, node_ips: Mapping[str, tuple[str, ...]]) -> PolicyInputs:
        """What changed since the last call is computed again, the rest handed over as the
        same objects (a pass then recomputes only what reads it: ``render.LayoutCache``)."""
        with self.lock:
            self.refresh_pods()
            policies = self.policy_order
            policies.follow(self.policies.items, self.policies.take_touched())
            if self.namespaces.take_touched() != set():
                self.labels = dict(self.namespaces.items)
            pods = self.order
        return PolicyInputs(
            pods.sorted,
            self.labels,
            policies.sorted,
            dict(node_ips),
            groups=pods.groups,
            policy_groups=policies.groups,
        )

    def refresh_pods(self) -> None:
        """Under the lock: the Pods whose object or attachments changed, joined again
        (``attached.calc_pod``); the others keep their ``PodInfo``."""
        touched = self.pods.take_touched()
        if touched is None:
            touched = self.pods.items.keys() | self.order.held.keys()
        touched |= self.attached_touched
        self.attached_touched = set()
        by_ref: dict[str, list[AttachedPod]] = {}
        for pod in self.attached.values():
            by_ref.setdefault(pod.ref, []).append(pod)
        joined = {ref: self.join(ref, by_ref.get(ref, ())) for ref in touched}
        self.order.follow(joined, touched)

    def join(self, ref: str, attached: Iterable[AttachedPod]) -> PodInfo | None:
        """Under the lock: the Pod ``ref`` with its attachments (None: it takes no part)."""
        obj = self.pods.items.get(ref)
        return calc_pod(obj, attached) if obj is not None else None

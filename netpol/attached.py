"""This node's Pod attachments laid over the API server's Pod objects (pure).

kubelet writes a Pod's ``status.podIPs`` only after the CNI ADD returned, so when its
containers start the API server (and a policy model read from it) does not know its
addresses yet. The ADD does: it tells NetworkPolicy the attachment's Pod (CNI_ARGS
``K8S_POD_NAMESPACE``, ``K8S_POD_NAME``, ``K8S_POD_UID`` when the runtime sends it) and the
addresses it assigned (``AttachedPod``). ``calc_pods`` joins them with the API's objects:

- the Pod object gives the rest (labels, node, named ports): it exists before the sandbox;
- an attached Pod takes its attachments' addresses; the API's own addresses count only for
  a Pod this node has no attachment of (equal ones make the attachment redundant, and after a
  sandbox was made again the attachment is the newer word);
- an ended Pod (Succeeded, Failed) or one the API no longer has takes no part, attached or
  not: the API wins. So does a Pod object of another uid (a Pod made again under the name).

The attachments live in pycnid's memory; a pycnid that starts again takes them back from
pycni-ipam's handles of this node (``read_attached``: each holds its attachment's addresses
and the Pod's CNI_ARGS as attributes), so a Pod whose status kubelet has not written yet stays
isolated across the restart. An attachment of another IPAM is not recorded there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace

from common.attachment import Attachment
from ipam.records import HandleRecord
from netpol.evaluate import PodInfo, pod_infos
from store.base import Store
from store.keys import HANDLES

log = logging.getLogger("pycnid.netpol")


@dataclass(frozen=True)
class PodObject:
    """A Pod as the API server holds it: what policies read of it (``info``, with the
    addresses of its status, maybe none yet), its uid, and whether it has ended."""

    info: PodInfo
    uid: str = ""
    ended: bool = False


@dataclass(frozen=True)
class AttachedPod:
    """One attachment this node's ADD made: its Pod and the addresses the ADD assigned."""

    namespace: str
    name: str
    ips: tuple[str, ...]
    uid: str = ""  # K8S_POD_UID; "" when the runtime sent none

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def is_of(self, obj: PodObject) -> bool:
        """The same Pod: same name, and same uid when both are known."""
        return obj.info.ref == self.ref and (not self.uid or not obj.uid or obj.uid == self.uid)


def calc_pods(
    objects: Iterable[PodObject], attached: Iterable[AttachedPod]
) -> tuple[PodInfo, ...]:
    """The Pods that take part, each with its addresses (the module's doc says which)."""
    by_ref: dict[str, list[AttachedPod]] = {}
    for pod in attached:
        by_ref.setdefault(pod.ref, []).append(pod)
    return pod_infos(
        filter(None, (calc_pod(obj, by_ref.get(obj.info.ref, ())) for obj in objects))
    )


def calc_pod(obj: PodObject, attached: Iterable[AttachedPod]) -> PodInfo | None:
    if obj.ended:
        return None
    ips = tuple(dict.fromkeys(ip for pod in attached if pod.is_of(obj) for ip in pod.ips))
    if not ips:
        return obj.info if obj.info.ips else None
    return replace(obj.info, ips=ips)


def calc_attached(records: Iterable[HandleRecord], node: str) -> dict[str, AttachedPod]:
    """This node's attachments of named Pods, by attachment tag (the key pycni-bridge uses)."""
    found = {}
    for record in records:
        namespace, name = (record.attributes.get(k, "") for k in ("namespace", "pod"))
        if record.node == node and namespace and name and record.ips:
            handle = record.handle
            tag = Attachment(handle.network, handle.container_id, handle.ifname).tag
            ips = tuple(ip.ip for ip in record.ips)
            found[tag] = AttachedPod(namespace, name, ips, record.attributes.get("podUID", ""))
    return found


def read_attached(store: Store, node: str) -> dict[str, AttachedPod]:
    """``calc_attached`` over the store's handles; one it cannot read is logged and skipped."""
    records = []
    for kv in store.range(HANDLES):
        try:
            records.append(HandleRecord.from_bytes(kv.key, kv.value))
        except ValueError as exc:
            log.warning("netpol: handle %s unreadable, not taken back: %s", kv.key, exc)
    return calc_attached(records, node)

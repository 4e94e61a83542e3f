"""Which Kubernetes Pod an ADD attaches, for NetworkPolicy (pure, no I/O).

Under the Kubernetes source NetworkPolicy reads Pods from the API server, which learns a
Pod's addresses only when kubelet writes them after the ADD returned; pycni-bridge's ADD is
the one step of a Kubernetes conflist (``conf/kubernetes/30-config.yaml``) that knows them
first, so it hands them over (``settle_attached``, ``netpol/sync.py``). The Pod is CNI_ARGS'
``K8S_POD_NAMESPACE`` / ``K8S_POD_NAME`` (what containerd and CRI-O send), with
``K8S_POD_UID`` when sent. Neither name: no Kubernetes Pod (podman, cnitool), nothing to
isolate. One without the other, or one that is no Kubernetes name: code 7 naming the key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cni.spec.errors import InvalidConfig
from kernel.addr import IPInterface
from netpol.attached import AttachedPod
from plugins.svc.args import DNS_SUBDOMAIN  # pycni-svc's rules for the same CNI_ARGS
from services.validate import DNS_LABEL

NAMES = (
    ("K8S_POD_NAMESPACE", DNS_LABEL, "a DNS label"),
    ("K8S_POD_NAME", DNS_SUBDOMAIN, "a DNS subdomain"),
)


def parse_pod_identity(args: Mapping[str, str]) -> tuple[str, str] | None:
    """(namespace, name) of the Pod, None when neither is given; code 7 naming the key."""
    if not any(key in args for key, _rule, _what in NAMES):
        return None
    for key, rule, what in NAMES:
        value = args.get(key, "")
        if not rule.fullmatch(value):
            raise InvalidConfig(
                f"invalid CNI_ARGS {key}",
                f"{value!r} is not {what} (NetworkPolicy names the Pod by it)",
            )
    return args["K8S_POD_NAMESPACE"], args["K8S_POD_NAME"]


def calc_attached_pod(
    args: Mapping[str, str], addresses: Iterable[IPInterface]
) -> AttachedPod | None:
    """The Pod this ADD attaches with the addresses it assigned; None: no Kubernetes Pod."""
    identity = parse_pod_identity(args)
    if identity is None:
        return None
    ips = tuple(str(a.ip) for a in addresses)
    return AttachedPod(*identity, ips, uid=args.get("K8S_POD_UID", ""))

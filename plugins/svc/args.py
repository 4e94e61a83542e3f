"""What pycni-svc publishes for one attachment, read from the request (pure, no I/O).

The Pod's identity comes from CNI_ARGS ``K8S_POD_NAMESPACE`` / ``K8S_POD_NAME`` (what
containerd and CRI-O send); both are required, as DNS labels / subdomains, since they are
segments of the endpoint key. Its labels come from the CNI ``args`` convention
``args.cni.labels`` — ``[{"key": "app", "value": "web"}]`` or a plain ``{"app": "web"}`` — or,
without it, from CNI_ARGS ``PYCNI_LABELS=app:web,tier:front`` (``:`` since libcni and cnitool
refuse a second ``=`` in a pair; no label key or value holds one). Its named container ports come
from ``args.cni.ports``: ``[{"name": "http", "containerPort": 8080, "protocol": "TCP"}]``
(protocol TCP, UDP or SCTP, TCP when left out; a name appears once, as in a Pod spec, so the
record keeps name -> port, and name -> protocol for the ports that are not TCP, which a
NetworkPolicy's named port is resolved with). Its addresses are prevResult's that belong to this
ifname (or to no interface). Anything else is refused with code 7 naming the key.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from cni.spec.errors import InvalidConfig
from cni.spec.result import canonical
from services.validate import DNS_LABEL, LABEL_VALUE  # the Service side's, the same rules

DNS_SUBDOMAIN = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?"
    r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
PORT_NAME = re.compile(r"^(?=.{1,15}$)(?=.*[a-z])[a-z0-9]+(-[a-z0-9]+)*$")
PROTOCOLS = ("TCP", "UDP", "SCTP")


def refuse(key: str, why: str) -> InvalidConfig:
    return InvalidConfig(f"invalid {key}", why)


def validate_identity(args: Mapping[str, str]) -> tuple[str, str]:
    """(namespace, pod) from CNI_ARGS: the endpoint key's segments."""
    namespace = args.get("K8S_POD_NAMESPACE", "")
    pod = args.get("K8S_POD_NAME", "")
    if not DNS_LABEL.fullmatch(namespace):
        raise refuse(
            "CNI_ARGS K8S_POD_NAMESPACE",
            f"{namespace!r} is not a DNS label (pycni-svc publishes the Pod under its namespace)",
        )
    if not DNS_SUBDOMAIN.fullmatch(pod):
        raise refuse(
            "CNI_ARGS K8S_POD_NAME",
            f"{pod!r} is not a DNS subdomain (pycni-svc publishes the Pod under its name)",
        )
    return namespace, pod


def cni_args(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """``args.cni`` of the netconf ({} when absent)."""
    args = config.get("args")
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise refuse("args", "expected an object")
    found = args.get("cni", {})
    if not isinstance(found, dict):
        raise refuse("args.cni", "expected an object")
    return found


def validate_label(key: Any, value: Any, where: str) -> tuple[str, str]:
    if not isinstance(key, str) or not LABEL_KEY.fullmatch(key):
        raise refuse(where, f"label key {key!r} is not a Kubernetes label key")
    if not isinstance(value, str) or not LABEL_VALUE.fullmatch(value):
        raise refuse(where, f"label value {value!r} of {key} is not a Kubernetes label value")
    return key, value


def parse_label_list(items: list, where: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) != {"key", "value"}:
            raise refuse(f"{where}[{i}]", 'expected {"key": ..., "value": ...}')
        key, value = validate_label(item["key"], item["value"], f"{where}[{i}]")
        labels[key] = value
    return labels


def parse_labels_arg(text: str) -> dict[str, str]:
    """CNI_ARGS ``PYCNI_LABELS=k:v,k2:v2``."""
    where = "CNI_ARGS PYCNI_LABELS"
    labels: dict[str, str] = {}
    for pair in filter(None, text.split(",")):
        key, sep, value = pair.partition(":")
        if not sep:
            raise refuse(where, f"{pair!r} is not key:value")
        labels.update([validate_label(key, value, where)])
    return labels


def parse_labels(config: Mapping[str, Any], args: Mapping[str, str]) -> dict[str, str]:
    """``args.cni.labels`` when present, else CNI_ARGS ``PYCNI_LABELS``."""
    labels = cni_args(config).get("labels")
    if labels is None:
        return parse_labels_arg(args.get("PYCNI_LABELS", ""))
    if isinstance(labels, list):
        return parse_label_list(labels, "args.cni.labels")
    if isinstance(labels, dict):
        return dict(validate_label(k, v, "args.cni.labels") for k, v in labels.items())
    raise refuse("args.cni.labels", "expected a list of {key, value} or an object")


def parse_port(item: Any, where: str) -> tuple[str, int, str]:
    if not isinstance(item, dict):
        raise refuse(where, "expected {name, containerPort, protocol}")
    name, port = item.get("name"), item.get("containerPort")
    if not isinstance(name, str) or not PORT_NAME.fullmatch(name):
        raise refuse(f"{where}.name", f"{name!r} is not a port name (IANA_SVC_NAME)")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise refuse(f"{where}.containerPort", f"{port!r} is not a port 1-65535")
    if item.get("protocol", "TCP") not in PROTOCOLS:
        raise refuse(f"{where}.protocol", f"{item.get('protocol')!r} is not TCP, UDP or SCTP")
    return name, port, str(item.get("protocol", "TCP"))


def parse_named_ports(config: Mapping[str, Any]) -> list[tuple[str, int, str]]:
    """(name, containerPort, protocol) of each item of ``args.cni.ports``."""
    items = cni_args(config).get("ports", [])
    if not isinstance(items, list):
        raise refuse("args.cni.ports", "expected a list of {name, containerPort, protocol}")
    found: list[tuple[str, int, str]] = []
    for i, item in enumerate(items):
        name, port, protocol = parse_port(item, f"args.cni.ports[{i}]")
        if any(name == seen for seen, _, _ in found):
            raise refuse(f"args.cni.ports[{i}].name", f"port name {name!r} appears twice")
        found.append((name, port, protocol))
    return found


def parse_ports(config: Mapping[str, Any]) -> dict[str, int]:
    """Named container ports of ``args.cni.ports`` (unnamed ones cannot be a targetPort by
    name, so they are not asked for)."""
    return {name: port for name, port, _ in parse_named_ports(config)}


def parse_port_protocols(config: Mapping[str, Any]) -> dict[str, str]:
    """The protocol of each named port that is not TCP (``EndpointRecord.port_protocols``)."""
    return {name: proto for name, _, proto in parse_named_ports(config) if proto != "TCP"}


def calc_ips(prev: Any, version: str, ifname: str) -> tuple[str, ...]:
    """prevResult's addresses on ``ifname`` (or on no interface), without prefix length."""
    result = canonical(prev, version)
    names = [i.get("name") for i in result.get("interfaces", [])]
    ips = []
    for ip in result["ips"]:
        index = ip.get("interface")
        if index is None or (0 <= index < len(names) and names[index] == ifname):
            ips.append(str(ipaddress.ip_interface(ip["address"]).ip))
    return tuple(ips)

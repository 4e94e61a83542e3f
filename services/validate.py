"""An input Service spec (the record's JSON fields, from `pycni svc` or a file) -> ServiceRecord.

Every bad value is ``InvalidConfig`` (code 7) whose message names the field
(``ports[1].nodePort``), checked before anything is read from or written to the store, except
what only the store knows (a VIP or nodePort another Service holds: ``services.allocate``).
A spec leaves ``clusterIPs`` and ``nodePort`` out to have them allocated; what it gives must
fit the cluster's settings: a ClusterIP inside a service CIDR (one per family), a nodePort
inside the range, on a NodePort or LoadBalancer Service only (a LoadBalancer has nodePorts,
as in Kubernetes). externalIPs and loadBalancerIPs must not lie in a service CIDR, where the
allocator could hand them out as someone's VIP; loadBalancerIPs and loadBalancerSourceRanges
belong to a LoadBalancer Service only.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from cni.spec.errors import InvalidConfig
from services.record import (
    DEFAULT_AFFINITY_TIMEOUT,
    ServicePort,
    ServiceRecord,
    ServiceSettings,
    wants_health_check,
)

SPEC_FIELDS = ServiceRecord.FIELDS
PORT_FIELDS = ServicePort.FIELDS
TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
NODE_PORT_TYPES = ("NodePort", "LoadBalancer")
PROTOCOLS = ("TCP", "UDP", "SCTP")
AFFINITIES = ("None", "ClientIP")
POLICIES = ("Cluster", "Local")
MAX_AFFINITY_TIMEOUT = 86400
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
PORT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?$")  # IANA service name, <= 15
LABEL_KEY = re.compile(r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def bad(name: str, why: str) -> InvalidConfig:
    return InvalidConfig(f"invalid Service field {name}: {why}")


def validate_choice(spec: Mapping[str, Any], name: str, choices: tuple[str, ...]) -> str:
    value = spec.get(name, choices[0])
    if value not in choices:
        raise bad(name, f"{value!r} is not one of {', '.join(choices)}")
    return value


def validate_int(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad(name, f"{value!r} is not an integer in {low}-{high}")
    return value


def validate_list(spec: Mapping[str, Any], name: str) -> list:
    value = spec.get(name, [])
    if not isinstance(value, list):
        raise bad(name, "not a list")
    return value


def validate_fields(data: Any, name: str, known: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(data, dict):
        raise bad(name, "not a JSON object")
    extra = sorted(str(k) for k in data if k not in known)
    if extra:
        raise bad(f"{name}.{extra[0]}" if name else extra[0], "unknown field")
    return data


def validate_name(value: Any, name: str) -> str:
    if not isinstance(value, str) or not DNS_LABEL.fullmatch(value):
        raise bad(name, f"{value!r} is not a DNS label (a-z, 0-9, '-', at most 63)")
    return value


def validate_ip(value: Any, name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(value if isinstance(value, str) else "")
    except ValueError:
        raise bad(name, f"{value!r} is not an IP address") from None


def validate_target(value: Any, name: str) -> int | str:
    if isinstance(value, str):
        if not PORT_NAME.fullmatch(value) or value.isdigit():
            raise bad(name, f"{value!r} is neither a port number nor a port name")
        return value
    return validate_int(value, name, 1, 65535)


def validate_port(data: Any, at: str, node_ports: bool, settings: ServiceSettings) -> ServicePort:
    spec = validate_fields(data, at, PORT_FIELDS)
    name = spec.get("name", "")
    if name != "" and (not isinstance(name, str) or not PORT_NAME.fullmatch(name)):
        raise bad(f"{at}.name", f"{name!r} is not a port name (a-z, 0-9, '-', at most 15)")
    port = validate_int(spec.get("port"), f"{at}.port", 1, 65535)
    protocol = spec.get("protocol", "TCP")
    if protocol not in PROTOCOLS:
        raise bad(f"{at}.protocol", f"{protocol!r} is not one of {', '.join(PROTOCOLS)}")
    return ServicePort(
        name,
        protocol,
        port,
        validate_target(spec.get("targetPort", port), f"{at}.targetPort"),
        validate_node_port(spec, at, node_ports, settings),
    )


def validate_node_port(
    spec: Mapping[str, Any], at: str, allowed: bool, settings: ServiceSettings
) -> int:
    value = spec.get("nodePort", 0)
    if value is None or value == 0 and not isinstance(value, bool):
        return 0
    if not allowed:
        raise bad(f"{at}.nodePort", "only a NodePort or LoadBalancer Service has nodePorts")
    return validate_int(value, f"{at}.nodePort", *settings.node_port_range)


def validate_ports(
    spec: Mapping[str, Any], node_ports: bool, settings: ServiceSettings
) -> tuple[ServicePort, ...]:
    ports = tuple(
        validate_port(p, f"ports[{i}]", node_ports, settings)
        for i, p in enumerate(validate_list(spec, "ports"))
    )
    if not ports:
        raise bad("ports", "a Service needs at least one port")
    seen: dict[Any, int] = {}
    for i, port in enumerate(ports):
        if len(ports) > 1 and not port.name:
            raise bad(f"ports[{i}].name", "required when a Service has several ports")
        for what, key in (
            ("name", port.name),
            ("port", (port.port, port.protocol)),
            ("nodePort", (port.node_port or None, port.protocol)),
        ):
            if key not in ("", (None, port.protocol)) and (what, key) in seen:
                raise bad(f"ports[{i}].{what}", f"the same as ports[{seen[what, key]}]'s")
            seen.setdefault((what, key), i)
    return ports


def calc_networks(settings: ServiceSettings) -> list:
    return [ipaddress.ip_network(c) for c in settings.cidrs]


def validate_cluster_ips(spec: Mapping[str, Any], settings: ServiceSettings) -> tuple[str, ...]:
    found, families = [], set()
    for i, value in enumerate(validate_list(spec, "clusterIPs")):
        ip, at = validate_ip(value, f"clusterIPs[{i}]"), f"clusterIPs[{i}]"
        if ip.version in families:
            raise bad(at, f"a second IPv{ip.version} address (at most one per family)")
        net = next((n for n in calc_networks(settings) if ip in n), None)
        if net is None:
            raise bad(at, f"{ip} is in no service CIDR ({', '.join(settings.cidrs) or 'none'})")
        if ip == net.network_address or ip.version == 4 and ip == net.broadcast_address:
            raise bad(at, f"{ip} is the network or broadcast address of {net}")
        families.add(ip.version)
        found.append(str(ip))
    return tuple(found)


def validate_external_ips(
    spec: Mapping[str, Any], settings: ServiceSettings, name: str = "externalIPs"
) -> tuple[str, ...]:
    """externalIPs (or, by ``name``, loadBalancerIPs: checked the same way)."""
    found: list[str] = []
    for i, value in enumerate(validate_list(spec, name)):
        ip, at = validate_ip(value, f"{name}[{i}]"), f"{name}[{i}]"
        if special := calc_special(ip):
            raise bad(at, f"{ip} is {special}: not an address a Service can take")
        if any(ip in n for n in calc_networks(settings)):
            raise bad(at, f"{ip} is inside a service CIDR (those are for clusterIPs)")
        if str(ip) in found:
            raise bad(at, f"{ip} is given twice")
        found.append(str(ip))
    return tuple(found)


def calc_special(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """Why an address cannot be an externalIP ("" if it can): DNAT of the node's own
    loopback, a link-local (the metadata server's 169.254.169.254) or a multicast address
    would take traffic that is not the Service's (Kubernetes refuses them too)."""
    for what, test in (
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("unspecified", ip.is_unspecified),
    ):
        if test:
            return what
    return ""


def validate_load_balancer(
    spec: Mapping[str, Any], kind: str, settings: ServiceSettings
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """loadBalancerIPs and loadBalancerSourceRanges (CIDRs, host bits 0), LoadBalancer only."""
    ips = validate_external_ips(spec, settings, "loadBalancerIPs")
    ranges: list[str] = []
    for i, value in enumerate(validate_list(spec, "loadBalancerSourceRanges")):
        at = f"loadBalancerSourceRanges[{i}]"
        try:
            net = ipaddress.ip_network(value if isinstance(value, str) else "")
        except ValueError:
            raise bad(at, f"{value!r} is not a CIDR (address/prefix, host bits 0)") from None
        if str(net) in ranges:
            raise bad(at, f"{net} is given twice")
        ranges.append(str(net))
    for name, found in (("loadBalancerIPs", ips), ("loadBalancerSourceRanges", ranges)):
        if found and kind != "LoadBalancer":
            raise bad(name, "only a LoadBalancer Service has them")
    return ips, tuple(ranges)


def validate_selector(spec: Mapping[str, Any]) -> dict[str, str]:
    selector = spec.get("selector", {})
    if not isinstance(selector, dict):
        raise bad("selector", "not an object of label: value")
    for key, value in selector.items():
        if not isinstance(key, str) or not LABEL_KEY.fullmatch(key):
            raise bad("selector", f"{key!r} is not a label key")
        if not isinstance(value, str) or not LABEL_VALUE.fullmatch(value):
            raise bad(f"selector.{key}", f"{value!r} is not a label value")
    return dict(selector)


def validate_affinity(spec: Mapping[str, Any]) -> tuple[str, int]:
    affinity = validate_choice(spec, "sessionAffinity", AFFINITIES)
    if "timeoutSeconds" in spec and affinity != "ClientIP":
        raise bad("timeoutSeconds", "only with sessionAffinity ClientIP")
    return affinity, validate_int(
        spec.get("timeoutSeconds", DEFAULT_AFFINITY_TIMEOUT),
        "timeoutSeconds",
        1,
        MAX_AFFINITY_TIMEOUT,
    )


def validate_service(data: Any, settings: ServiceSettings) -> ServiceRecord:
    """The record a spec describes (clusterIPs and nodePorts it leaves out still to allocate)."""
    spec = validate_fields(data, "", SPEC_FIELDS)
    kind = validate_choice(spec, "type", TYPES)
    external = validate_choice(spec, "externalTrafficPolicy", POLICIES)
    if external == "Local" and kind not in NODE_PORT_TYPES:
        raise bad(
            "externalTrafficPolicy", "Local only applies to a NodePort or LoadBalancer Service"
        )
    affinity, timeout = validate_affinity(spec)
    ports = validate_ports(spec, kind in NODE_PORT_TYPES, settings)
    lb_ips, source_ranges = validate_load_balancer(spec, kind, settings)
    return ServiceRecord(
        validate_name(spec.get("namespace"), "namespace"),
        validate_name(spec.get("name"), "name"),
        kind,
        ports,
        validate_cluster_ips(spec, settings),
        validate_external_ips(spec, settings),
        validate_selector(spec),
        affinity,
        timeout,
        external,
        validate_choice(spec, "internalTrafficPolicy", POLICIES),
        health_check_node_port=validate_health_check_port(spec, kind, external, ports, settings),
        load_balancer_ips=lb_ips,
        load_balancer_source_ranges=source_ranges,
    )


def validate_health_check_port(
    spec: Mapping[str, Any],
    kind: str,
    external: str,
    ports: tuple[ServicePort, ...],
    settings: ServiceSettings,
) -> int:
    """An explicit healthCheckNodePort (0: none, or one to allocate): only where Kubernetes
    has one (externalTrafficPolicy Local on a NodePort or LoadBalancer Service), in the
    nodePort range, and not one of the Service's own TCP nodePorts."""
    value = spec.get("healthCheckNodePort", 0)
    if value is None or value == 0 and not isinstance(value, bool):
        return 0
    if not wants_health_check(kind, external):
        raise bad(
            "healthCheckNodePort",
            "only a NodePort or LoadBalancer Service with externalTrafficPolicy Local has one",
        )
    port = validate_int(value, "healthCheckNodePort", *settings.node_port_range)
    if any(p.protocol == "TCP" and p.node_port == port for p in ports):
        raise bad("healthCheckNodePort", f"{port} is one of the Service's own TCP nodePorts")
    return port


def validate_settings(cidrs: list[str], node_port_range: str) -> ServiceSettings:
    """`pycni svc config set`'s values: at most one CIDR per family, a sane nodePort range."""
    nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for i, text in enumerate(cidrs):
        try:
            net = ipaddress.ip_network(text)
        except ValueError:
            raise bad(
                f"cidrs[{i}]", f"{text!r} is not a CIDR (address/prefix, host bits 0)"
            ) from None
        if net.num_addresses < 4 or any(n.version == net.version for n in nets):
            raise bad(f"cidrs[{i}]", f"{net}: at most one CIDR per family, of 4 addresses or more")
        nets.append(net)
    low, _, high = node_port_range.partition("-")
    if not (low.isdigit() and high.isdigit() and 1 <= int(low) <= int(high) <= 65535):
        raise bad("nodePortRange", f"{node_port_range!r} is not A-B within 1-65535")
    return ServiceSettings(tuple(map(str, nets)), (int(low), int(high)))

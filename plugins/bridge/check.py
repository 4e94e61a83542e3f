"""pycni-bridge CHECK: compare the live state with prevResult and name what differs.

Checked: the container veth (in the pod, MAC, MTU), its host peer (name, peer index, bridge
port, hairpin), the bridge (kind, MAC, promisc, gateway address), the addresses and routes
inside the pod, the masquerade elements, and the IPAM lease (delegated CHECK).
"""

from __future__ import annotations

import ipaddress

from cni.spec.errors import CheckFailed, InvalidConfig
from cni.spec.request import Request
from cni.spec.result import canonical
from common.attachment import Attachment
from kernel import addr, link, route
from kernel.session import node_session, pod_session
from masq.rules import FAMILY, TABLE, elements_for
from plugins.bridge.add import validate_pod_netns
from plugins.bridge.calc import bridge_addresses, masq_pairs, route_specs
from plugins.bridge.config import BridgeConfig, parse_bridge_config
from plugins.bridge.context import BridgeContext
from plugins.bridge.delegate import delegate
from plugins.bridge.errors import failing
from plugins.bridge.overlay import fit_to_node


def run_check(ctx: BridgeContext, req: Request) -> None:
    cfg = fit_to_node(parse_bridge_config(req), ctx.overlay)
    prev = expected_result(req)
    netns_fd = validate_pod_netns(req)
    index = container_index(prev, req)
    ips = [ip for ip in prev.get("ips", []) if ip.get("interface", index) == index]
    att = Attachment.of(req)
    with failing("CHECK could not read the live state"):
        with node_session() as node, pod_session(netns_fd) as (pod, _):
            container = validate_container(pod, req, prev["interfaces"][index], cfg)
            host = validate_host_veth(node, att, container, cfg)
            bridge = validate_bridge(node, cfg, host, prev)
            validate_addresses(pod, container, ips, req.env.ifname)
            validate_routes(pod, prev.get("routes", []), ips, container)
            if cfg.is_gateway:
                validate_gateway(node, bridge, ips)
        if cfg.ip_masq:
            validate_masquerade(ctx, att, cfg.bridge, ips)
    delegate(ctx.plugins, req, "CHECK")


def expected_result(req: Request) -> dict:
    if req.prev_result in (None, {}, ""):
        raise InvalidConfig(
            "required prevResult missing",
            "CHECK compares the live state with "
            "the ADD result, which the runtime passes as prevResult",
        )
    return canonical(req.prev_result, req.version)


def container_index(prev: dict, req: Request) -> int:
    for i, iface in enumerate(prev.get("interfaces", [])):
        if iface.get("name") == req.env.ifname and iface.get("sandbox") == req.env.netns:
            return i
    raise CheckFailed(f"prevResult lists no interface {req.env.ifname} in sandbox {req.env.netns}")


def validate_container(pod, req: Request, expected: dict, cfg: BridgeConfig) -> link.LinkInfo:
    ifname = req.env.ifname
    found = link.get_link(pod, ifname)
    if found is None:
        raise CheckFailed(f"container interface {ifname} is missing from {req.env.netns}")
    if found.kind != "veth":
        raise CheckFailed(
            f"container interface {ifname} is a {found.kind or 'device'}, not a veth"
        )
    if expected.get("mac") and expected["mac"].lower() != found.mac:
        raise CheckFailed(
            f"container interface {ifname} has MAC {found.mac}, prevResult says {expected['mac']}"
        )
    if cfg.mtu and found.mtu != cfg.mtu:
        raise CheckFailed(
            f"container interface {ifname} has MTU {found.mtu}, config says {cfg.mtu}"
        )
    return found


def validate_host_veth(
    node, att: Attachment, container: link.LinkInfo, cfg: BridgeConfig
) -> link.LinkInfo:
    host = link.get_link(node, att.host_veth)
    if host is None:
        raise CheckFailed(f"host veth {att.host_veth} of {att.ifname} is missing from the node")
    if host.peer_index != container.index or container.peer_index != host.index:
        raise CheckFailed(f"host veth {att.host_veth} is not the peer of {att.ifname}")
    if cfg.mtu and host.mtu != cfg.mtu:
        raise CheckFailed(f"host veth {att.host_veth} has MTU {host.mtu}, config says {cfg.mtu}")
    return host


def validate_bridge(node, cfg: BridgeConfig, host: link.LinkInfo, prev: dict) -> link.LinkInfo:
    bridge = link.get_link(node, cfg.bridge)
    if bridge is None or bridge.kind != "bridge":
        raise CheckFailed(f"bridge {cfg.bridge} is missing from the node")
    if host.master != bridge.index:
        raise CheckFailed(f"host veth {host.name} is not a port of bridge {cfg.bridge}")
    if cfg.hairpin and not host.hairpin:
        raise CheckFailed(f"host veth {host.name} has hairpin mode off, config says on")
    listed = [i for i in prev.get("interfaces", []) if i.get("name") == cfg.bridge]
    if listed and listed[0].get("mac") and listed[0]["mac"].lower() != bridge.mac:
        raise CheckFailed(
            f"bridge {cfg.bridge} has MAC {bridge.mac}, prevResult says {listed[0]['mac']}"
        )
    if cfg.promisc and not bridge.promisc:
        raise CheckFailed(
            f"bridge {cfg.bridge} is not in promiscuous mode, config says promiscMode"
        )
    return bridge


def validate_addresses(pod, container: link.LinkInfo, ips: list[dict], ifname: str) -> None:
    have = addr.list_addresses(pod, container.index)
    for ip in ips:
        if ipaddress.ip_interface(ip["address"]) not in have:
            raise CheckFailed(f"address {ip['address']} is missing from {ifname}")


def validate_routes(pod, routes: list[dict], ips: list[dict], container: link.LinkInfo) -> None:
    """Each route on this attachment's own device: another attachment's route to the same
    destination does not count."""
    live = {v: route.list_routes(pod, v, table=None) for v in (4, 6)}
    for want in route_specs(routes, ips, container.index):
        table = want.table or route.MAIN_TABLE
        if not any(
            r.dst == want.dst and r.gw == want.gw and r.oif == want.oif and r.table == table
            for r in live[want.dst.version]
        ):
            via = f" via {want.gw}" if want.gw else ""
            raise CheckFailed(f"route {want.dst}{via} dev {container.name} is missing in the pod")


def validate_gateway(node, bridge: link.LinkInfo, ips: list[dict]) -> None:
    have = addr.list_addresses(node, bridge.index)
    for want in bridge_addresses(ips):
        if want not in have:
            raise CheckFailed(f"gateway address {want} is missing from bridge {bridge.name}")


def validate_masquerade(ctx: BridgeContext, att: Attachment, bridge: str, ips: list[dict]) -> None:
    have = ctx.masq.elements(att.tag)
    for elem in elements_for(att.tag, bridge, masq_pairs(ips)):
        if elem not in have:
            raise CheckFailed(
                f"masquerade element {elem.key} of {att.tag} is missing from "
                f"set {elem.set} of table {FAMILY} {TABLE}"
            )

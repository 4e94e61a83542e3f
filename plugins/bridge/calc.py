"""Pure calculations of pycni-bridge: gateways, routes, bridge addresses, the result.

No I/O here, so every rule is a unit test away.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from cni.spec.errors import InvalidConfig
from kernel.addr import IPInterface
from kernel.route import Route

BRIDGE_INDEX, HOST_INDEX, CONTAINER_INDEX = 0, 1, 2
DEFAULT_DST = {4: ipaddress.ip_network("0.0.0.0/0"), 6: ipaddress.ip_network("::/0")}
IPAddress = IPv4Address | IPv6Address


def calc_ips(ipam_ips: Iterable[dict], is_gateway: bool) -> list[dict]:
    """IPAM's ips on the container interface; with isGateway a missing gateway becomes the
    subnet's first address (as the reference does: only a foreign IPAM gets here, pycni-ipam
    refuses isGateway without a gateway). A gateway that is the Pod's own address is
    InvalidConfig: the bridge would hold the Pod's address."""
    out = []
    for ip in ipam_ips:
        item = {**ip, "interface": CONTAINER_INDEX}
        guessed = not item.get("gateway") and is_gateway
        if guessed:
            network = ipaddress.ip_interface(item["address"]).network
            item["gateway"] = str(network.network_address + 1)
        validate_gateway_not_pod(item, guessed)
        out.append(item)
    return out


def validate_gateway_not_pod(ip: dict, guessed: bool) -> None:
    address = ipaddress.ip_interface(ip["address"])
    if not ip.get("gateway") or ipaddress.ip_address(ip["gateway"]) != address.ip:
        return
    if guessed:
        raise InvalidConfig(
            f"the IPAM returned no gateway for {address} and isGateway would put the "
            f"subnet's first address {address.ip}, the Pod's own address, on the bridge",
            "let the IPAM return a gateway, or keep that address out of its range",
        )
    raise InvalidConfig(
        f"the IPAM returned the Pod's own address {address} as its gateway",
        "an IPAM must never hand out its gateway: fix the IPAM config",
    )


def calc_pod_on_bridge(
    pod: Iterable[IPInterface], bridge: Iterable[IPInterface]
) -> list[tuple[IPInterface, IPInterface]]:
    """(pod address, bridge address) pairs that are the same IP: one address on two
    interfaces, which the ADD refuses."""
    held = {b.ip: b for b in bridge}
    return [(p, held[p.ip]) for p in pod if p.ip in held]


def family_gateways(ips: Iterable[dict]) -> dict[int, IPAddress]:
    """The first gateway of each address family."""
    out: dict[int, IPAddress] = {}
    for ip in ips:
        if ip.get("gateway"):
            gw = ipaddress.ip_address(ip["gateway"])
            out.setdefault(gw.version, gw)
    return out


def calc_routes(
    ipam_routes: Iterable[dict], ips: list[dict], is_default_gateway: bool
) -> list[dict]:
    """The result's routes: IPAM's, plus a default route per gateway family with
    isDefaultGateway when IPAM gave none."""
    routes = [dict(r) for r in ipam_routes]
    if is_default_gateway:
        have = {ipaddress.ip_network(r["dst"], strict=False) for r in routes}
        for version, gw in sorted(family_gateways(ips).items()):
            if DEFAULT_DST[version] not in have:
                routes.append({"dst": str(DEFAULT_DST[version]), "gw": str(gw)})
    return routes


def route_specs(routes: Iterable[dict], ips: list[dict], oif: int) -> list[Route]:
    """Routes to install in the pod: a route without `gw` goes via its family's gateway."""
    gateways = family_gateways(ips)
    out = []
    for r in routes:
        dst = ipaddress.ip_network(r["dst"], strict=False)
        gw = ipaddress.ip_address(r["gw"]) if r.get("gw") else gateways.get(dst.version)
        out.append(
            Route(
                dst=dst,
                gw=gw,
                oif=oif,
                priority=r.get("priority"),
                table=r.get("table"),
                scope=r.get("scope"),
                mtu=r.get("mtu"),
                advmss=r.get("advmss"),
            )
        )
    return out


def container_addresses(ips: Iterable[dict]) -> list[IPInterface]:
    return [ipaddress.ip_interface(ip["address"]) for ip in ips]


def bridge_addresses(ips: Iterable[dict]) -> list[IPInterface]:
    """The gateway addresses (gateway/prefix of its subnet) that isGateway puts on the bridge."""
    out: list[IPInterface] = []
    for ip in ips:
        if ip.get("gateway"):
            prefix = ipaddress.ip_interface(ip["address"]).network.prefixlen
            address = ipaddress.ip_interface(f"{ip['gateway']}/{prefix}")
            if address not in out:
                out.append(address)
    return out


def calc_bridge_conflicts(
    existing: Iterable[IPInterface], wanted: list[IPInterface]
) -> list[IPInterface]:
    """Bridge addresses that stand in the way of ``wanted`` (as the reference decides):
    any other IPv4 address once an IPv4 gateway is wanted; an IPv6 address that overlaps a
    wanted IPv6 subnet. Link-local addresses never conflict."""
    out: list[ipaddress.IPv4Interface | ipaddress.IPv6Interface] = []
    for have in existing:
        if have in wanted or have.ip.is_link_local:
            continue
        if have.version == 4 and any(w.version == 4 for w in wanted):
            out.append(have)
        elif have.version == 6 and any(
            w.version == 6 and w.network.overlaps(have.network) for w in wanted
        ):
            out.append(have)
    return out


def masq_pairs(ips: Iterable[dict]) -> list[tuple[IPAddress, IPv4Network | IPv6Network]]:
    """(pod address, its own subnet) for each address:
    traffic into the subnet is not masqueraded."""
    return [(i.ip, i.network) for i in container_addresses(ips)]


def build_result(
    *, bridge: dict, host: dict, container: dict, ips: list[dict], routes: list[dict], dns: dict
) -> dict:
    """The canonical (1.1.0-shaped) ADD result: interfaces [bridge, host veth, container]."""
    return {
        "cniVersion": "1.1.0",
        "interfaces": [bridge, host, container],
        "ips": ips,
        "routes": routes,
        "dns": dns,
    }

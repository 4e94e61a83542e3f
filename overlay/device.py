"""This node's end of the overlay: the VXLAN device with its VTEP addresses, and forwarding.

The device is made in pycnid's own netns (the node's), so its UDP socket lives on the node's
underlay. It is converged, never blindly recreated: a pycnid restart finds it as it was and
keeps it (traffic of existing Pods goes on). VTEP addresses go on it as host addresses (/32,
/128: no prefix route) marked as pycni's (IFA_PROTO); another pycni-marked address on it is a
VTEP address this node no longer has and is removed. host-gw has no device.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from pyroute2 import IPRoute

from kernel import addr, sysctl, vxlan
from kernel.link import LinkInfo, list_links
from overlay.config import OverlayConfig
from overlay.underlay import Underlay, calc_overlay_mtu


@dataclass(frozen=True)
class NodeEnd:
    """What this node publishes and programs with: the MTU Pods get, the VTEP MAC."""

    config: OverlayConfig
    underlay: Underlay
    vtep_mac: str
    mtu: int

    @property
    def backend(self) -> str:
        return self.config.backend


def calc_mtu(config: OverlayConfig, underlay: Underlay) -> int:
    """The Pod MTU: configured, or the underlay's less the VXLAN header (host-gw: the same)."""
    if config.mtu:
        return config.mtu
    if config.backend != "vxlan":
        return underlay.mtu
    return calc_overlay_mtu(underlay.mtu, underlay.version)


def vxlan_spec(end: NodeEnd) -> vxlan.VxlanSpec:
    return vxlan.VxlanSpec(
        name=end.config.device_name,
        vni=end.config.vni,
        port=end.config.port,
        local=end.underlay.address,
        link_index=end.underlay.ifindex,
        mac=end.vtep_mac,
        mtu=end.mtu,
    )


def ensure_device(ipr: IPRoute, end: NodeEnd, vteps: tuple[str, ...]) -> LinkInfo:
    """The VXLAN device as configured, up, holding exactly this node's VTEP addresses."""
    device, created = vxlan.ensure_vxlan(ipr, vxlan_spec(end))
    if created:
        sysctl.ensure_sysctl(f"net/ipv6/conf/{device.name}/accept_ra", "0", missing_ok=True)
    ensure_vtep_addresses(ipr, device.index, vteps)
    return device


def ensure_vtep_addresses(ipr: IPRoute, index: int, vteps: tuple[str, ...]) -> None:
    wanted = {
        ipaddress.ip_interface(f"{v}/{ipaddress.ip_address(v).max_prefixlen}") for v in vteps
    }
    have = addr.list_addresses_by_proto(ipr, index)
    for stale in (
        a for a, proto in have.items() if proto == addr.ADDR_PROTO_PYCNI and a not in wanted
    ):
        addr.delete_address(ipr, index, stale)
    for address in wanted - set(have):
        addr.add_address(ipr, index, address, exist_ok=True, proto=addr.ADDR_PROTO_PYCNI)


def ensure_forwarding() -> None:
    """A node routes for its Pods (set in the node netns: it is 0 in a new namespace)."""
    sysctl.ensure_sysctl("net/ipv4/ip_forward", "1")
    sysctl.ensure_sysctl("net/ipv6/conf/all/forwarding", "1", missing_ok=True)


def serving_map(ipr: IPRoute, skip: int | None) -> dict:
    """ifindex -> the pycni-marked networks on it (the bridges' gateway subnets)."""
    out: dict[int, list] = {}
    for found in list_links(ipr):
        if found.index == skip or found.kind != "bridge":
            continue
        nets = [
            a.network
            for a, proto in addr.list_addresses_by_proto(ipr, found.index).items()
            if proto == addr.ADDR_PROTO_PYCNI
        ]
        if nets:
            out[found.index] = nets
    return out


def calc_serving(networks: dict, ip: str) -> int | None:
    """The bridge whose gateway subnet holds ``ip`` (the longest such subnet)."""
    address = ipaddress.ip_address(ip)
    best = max(
        (
            (net.prefixlen, index)
            for index, nets in networks.items()
            for net in nets
            if net.version == address.version and address in net
        ),
        default=None,
    )
    return best[1] if best else None

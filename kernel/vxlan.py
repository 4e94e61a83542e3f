"""The VXLAN device over netlink: create, read back, converge. No policy here.

What the kernel cannot change on a live vxlan device (VNI, UDP port, local address, underlay
device, learning) is fixed by deleting and recreating it; MAC and MTU are set in place. A link
of the name that is not a vxlan device is someone else's and is never deleted. Learning is sent
off explicitly: the kernel's default is on, and a learning VTEP would trust any source.

Created in the netns the ``IPRoute`` is bound to (pycnid's node netns). Round trips: one (a
get) when the device is as wanted; a get and a set to fix MAC/MTU/up; get, add, get to create.
"""

from __future__ import annotations

import errno
import ipaddress
from dataclasses import dataclass, replace
from typing import Literal

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from kernel.link import LinkError, LinkInfo, link_info

Plan = Literal["keep", "update", "recreate"]


@dataclass(frozen=True)
class VxlanSpec:
    name: str
    vni: int
    port: int  # UDP destination port
    local: str  # underlay address (IPv4 or IPv6), the outer source
    link_index: int  # underlay device (0: none)
    mac: str
    mtu: int
    learning: bool = False  # sent as given (off unless asked): the kernel's default is on


def vxlan_request(spec: VxlanSpec) -> dict:
    """The pyroute2 arguments that create the device, up (pure)."""
    local = ipaddress.ip_address(spec.local)
    args: dict = {
        "ifname": spec.name,
        "kind": "vxlan",
        "vxlan_id": spec.vni,
        "vxlan_port": spec.port,
        "vxlan_learning": int(spec.learning),
        "vxlan_local" if local.version == 4 else "vxlan_local6": str(local),
        "address": spec.mac.lower(),
        "mtu": spec.mtu,
        "state": "up",
    }
    if spec.link_index:
        args["vxlan_link"] = spec.link_index
    return args


def vxlan_of(msg) -> VxlanSpec | None:
    """A link message as a VxlanSpec; None unless it is a vxlan device."""
    linkinfo = msg.get("IFLA_LINKINFO")
    if not linkinfo or linkinfo.get("IFLA_INFO_KIND") != "vxlan":
        return None
    data = linkinfo.get("IFLA_INFO_DATA")
    local = data.get("IFLA_VXLAN_LOCAL") or data.get("IFLA_VXLAN_LOCAL6") or "0.0.0.0"
    return VxlanSpec(
        name=msg.get("IFLA_IFNAME"),
        vni=data.get("IFLA_VXLAN_ID"),
        port=data.get("IFLA_VXLAN_PORT") or 0,
        local=str(ipaddress.ip_address(local)),
        link_index=data.get("IFLA_VXLAN_LINK") or 0,
        mac=(msg.get("IFLA_ADDRESS") or "").lower(),
        mtu=msg.get("IFLA_MTU") or 0,
        learning=bool(data.get("IFLA_VXLAN_LEARNING")),
    )


def calc_vxlan_plan(want: VxlanSpec, have: VxlanSpec) -> Plan:
    """What it takes to turn the device ``have`` into ``want`` (pure)."""
    if tunnel_of(want) != tunnel_of(have):
        return "recreate"
    return "keep" if (want.mac.lower(), want.mtu) == (have.mac, have.mtu) else "update"


def tunnel_of(spec: VxlanSpec) -> tuple:
    """The attributes a live device cannot change (the local address normalized)."""
    return (
        spec.name,
        spec.vni,
        spec.port,
        ipaddress.ip_address(spec.local),
        spec.link_index,
        spec.learning,
    )


def read_vxlan(ipr: IPRoute, name: str) -> VxlanSpec | None:
    """The vxlan device ``name`` as the kernel has it (learning included); None when there is
    no link of that name or it is not a vxlan device."""
    msg = link_msg(ipr, name)
    return vxlan_of(msg) if msg is not None else None


def link_msg(ipr: IPRoute, name: str):
    try:
        return ipr.link("get", ifname=name)[0]
    except NetlinkError as exc:
        if exc.code == errno.ENODEV:
            return None
        raise


def ensure_vxlan(ipr: IPRoute, spec: VxlanSpec) -> tuple[LinkInfo, bool]:
    """The device as ``spec`` says, up; returns (device, whether this call created it).

    Raises LinkError if ``spec.name`` is a link of another kind (it is left alone)."""
    msg = link_msg(ipr, spec.name)
    if msg is None:
        return create_vxlan(ipr, spec)
    have = vxlan_of(msg)
    if have is None:
        kind = link_info(msg).kind or "device"
        raise LinkError(f"{spec.name} exists and is a {kind}, not a vxlan device")
    plan = calc_vxlan_plan(spec, have)
    if plan == "recreate":
        ipr.link("del", index=msg["index"])
        return create_vxlan(ipr, spec)
    return update_vxlan(ipr, link_info(msg), spec, plan), False


def create_vxlan(ipr: IPRoute, spec: VxlanSpec) -> tuple[LinkInfo, bool]:
    """Add the device (someone else adding it first is fine) and read it back."""
    created = True
    try:
        ipr.link("add", **vxlan_request(spec))
    except NetlinkError as exc:
        if exc.code != errno.EEXIST:
            raise
        created = False
    msg = link_msg(ipr, spec.name)
    have = vxlan_of(msg) if msg is not None else None
    if have is None or calc_vxlan_plan(spec, have) == "recreate":
        raise LinkError(f"vxlan device {spec.name} changed while it was being created")
    return link_info(msg), created


def update_vxlan(ipr: IPRoute, link: LinkInfo, spec: VxlanSpec, plan: Plan) -> LinkInfo:
    """Set MAC and MTU in place and bring the device up, in one request (none if all is so)."""
    if plan == "keep" and link.up:
        return link
    ipr.link("set", index=link.index, address=spec.mac.lower(), mtu=spec.mtu, state="up")
    return replace(link, mac=spec.mac.lower(), mtu=spec.mtu, up=True)

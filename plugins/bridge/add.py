"""pycni-bridge ADD as named steps. Each step pushes its undo onto one ExitStack (disarmed on
success) and is preceded by a fault point, so a test can fail every step in turn and find
nothing left behind. The bridge, its gateway address and ip_forward are shared node state and
are never undone (as the reference: bridges are never deleted).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from cni.spec.errors import (
    AttachmentExists,
    CNIError,
    InternalError,
    InvalidEnvironment,
    NodeChangeFailed,
)
from cni.spec.request import Request
from common.attachment import Attachment
from kernel import addr, link, neigh, route, sysctl
from kernel.session import node_session, pod_session
from plugins.bridge.calc import (
    bridge_addresses,
    build_result,
    calc_ips,
    calc_routes,
    container_addresses,
    masq_pairs,
    route_specs,
)
from plugins.bridge.config import BridgeConfig, parse_bridge_config
from plugins.bridge.context import BridgeContext
from plugins.bridge.delegate import delegate, validate_delegation
from plugins.bridge.errors import describe, failing
from plugins.bridge.isolation import calc_attached_pod, parse_pod_identity
from plugins.bridge.overlay import ensure_neighbour_proxy, ensure_quick_resolve, fit_to_node

log = logging.getLogger("pycnid.bridge")


@dataclass
class AddState:
    req: Request
    cfg: BridgeConfig
    att: Attachment
    netns_fd: int  # the pod's netns (validate_pod_netns)
    node: IPRoute
    resources: ExitStack
    bridge_link: link.LinkInfo | None = None  # set by the first step, ensure_bridge

    @property
    def bridge(self) -> link.LinkInfo:
        if self.bridge_link is None:
            raise InternalError("bridge step reached before ensure_bridge")
        return self.bridge_link

    ips: list[dict] = field(default_factory=list)
    routes: list[dict] = field(default_factory=list)
    dns: dict = field(default_factory=dict)
    host_mac: str = ""
    host_index: int = 0
    container_mac: str = ""


def ensure_bridge(ctx: BridgeContext, st: AddState, undo: ExitStack) -> None:
    st.bridge_link = ctx.bridges.ensure_bridge(st.node, st.cfg)


def add_ipam(ctx: BridgeContext, st: AddState, undo: ExitStack) -> None:
    """A failed IPAM ADD cleans up after itself (as the reference assumes): the IPAM DEL is
    pushed only once it has leased something."""
    result = delegate(ctx.plugins, st.req, "ADD") or {}
    undo.callback(quietly("IPAM DEL", delegate, ctx.plugins, st.req, "DEL"))
    st.ips = calc_ips(result.get("ips") or [], st.cfg.is_gateway)
    st.routes = calc_routes(result.get("routes") or [], st.ips, st.cfg.is_default_gateway)
    st.dns = st.cfg.dns or result.get("dns") or {}


def setup_veth(ctx: BridgeContext, st: AddState, undo: ExitStack) -> None:
    """The veth pair: host end on the bridge (up, MTU), container end CNI_IFNAME in the pod."""
    host, ifname = st.att.host_veth, st.req.env.ifname
    st.host_mac, st.container_mac = link.random_mac(), st.cfg.mac or link.random_mac()
    try:
        link.create_veth(
            st.node,
            host,
            ifname,
            st.netns_fd,
            host_mac=st.host_mac,
            peer_mac=st.container_mac,
            mtu=st.cfg.mtu,
            master=st.bridge.index,
        )
    except NetlinkError as exc:
        if exc.code == errno.EEXIST:
            raise explain_exists(host, ifname, st.req.env.netns) from None
        raise NodeChangeFailed(
            f"failed to create veth pair {host}/{ifname}", describe(exc)
        ) from None
    undo.callback(quietly(f"delete {host}", link.delete_link, st.node, host))
    st.host_index = socket.if_nametoindex(host)


def explain_exists(host: str, ifname: str, netns: str) -> CNIError:
    if link.link_exists(host):
        return attachment_exists(host)
    return AttachmentExists(
        f"container interface {ifname} already exists in {netns}",
        "CNI_IFNAME must not exist in the pod netns before ADD: "
        "choose another CNI_IFNAME or remove that interface",
    )


def attachment_exists(host: str) -> CNIError:
    return AttachmentExists(
        f"host veth {host} of this attachment already exists",
        "ADD was repeated without DEL: run DEL of this attachment first",
    )


def validate_pod_netns(req: Request) -> int:
    """CNI_NETNS must be a pod's netns, not the node's own (pycnid's); its fd."""
    if req.netns_fd is None:
        raise InvalidEnvironment(
            f"CNI_NETNS is required for {req.command}", "no pod netns was received"
        )
    pod, node = os.fstat(req.netns_fd), os.stat("/proc/thread-self/ns/net")
    if (pod.st_dev, pod.st_ino) == (node.st_dev, node.st_ino):
        raise InvalidEnvironment(
            "CNI_NETNS is the node's own network namespace",
            f"{req.env.netns} is where pycnid and the bridge live",
        )
    return req.netns_fd


def validate_new_attachment(att: Attachment) -> None:
    """Refuse a repeated ADD before IPAM is asked: IPAM would hand back the live lease, and
    the rollback of this ADD would then release an address still in use."""
    if link.link_exists(att.host_veth):
        raise attachment_exists(att.host_veth)


def setup_port(ctx: BridgeContext, st: AddState, undo: ExitStack) -> None:
    """Label the host veth with its attachment (for GC) and set hairpin mode."""
    with failing(f"failed to configure bridge port {st.att.host_veth}"):
        link.set_port(
            st.node, st.host_index, alias=st.att.alias, hairpin=True if st.cfg.hairpin else None
        )


def setup_pod(ctx: BridgeContext, st: AddState, undo: ExitStack) -> None:
    """Inside the pod: addresses, link up, routes (gw defaults to the family's gateway), each
    route on this attachment's device next to another attachment's route to the same dst."""
    ifname = st.req.env.ifname

    def inside() -> int:
        sysctl.ensure_sysctl(f"net/ipv4/conf/{ifname}/arp_notify", "1", missing_ok=True)
        if ctx.overlay is not None:
            ensure_quick_resolve(ifname)
        return socket.if_nametoindex(ifname)

    with failing(f"failed to configure {ifname} in {st.req.env.netns}"):
        pod, index = st.resources.enter_context(pod_session(st.netns_fd, inside))
        assert index is not None  # what inside() returned
        for address in container_addresses(st.ips):
            addr.add_address(pod, index, address)
        link.set_up(pod, index)
        for spec in route_specs(st.routes, st.ips, index):
            route.add_route(pod, spec, exist_ok=True)


def ensure_gateway(ctx: BridgeContext, st: AddState, undo: ExitStack) -> None:
    """isGateway: the gateway addresses on the bridge (forceAddress replaces another one);
    a Pod address the bridge already holds is refused."""
    wanted = bridge_addresses(st.ips) if st.cfg.is_gateway else []
    ctx.bridges.ensure_gateway(
        st.node, st.bridge, wanted, st.cfg.force_address, container_addresses(st.ips)
    )
    if wanted and ctx.overlay is not None:
        with failing(f"failed to answer for remote Pods on {st.cfg.bridge}"):
            ensure_neighbour_proxy(st.cfg.bridge, {a.version for a in wanted})


def setup_node_neighbours(ctx: BridgeContext, st: AddState, undo: ExitStack) -> None:
    """isGateway: the node's neighbour entries for the Pod's addresses on the bridge name the
    Pod's MAC. An address is reused after its Pod's DEL, and the node keeps the entry of the
    Pod that held it (a STALE entry lives on while the table is small): the node then sends
    the new Pod's packets to the old MAC until its probes fail, ~8 s. The Pod's own
    announcement at link-up (``arp_notify``) does not replace that entry reliably (it is sent
    before the bridge port forwards, and IPv6 has none)."""
    if not st.cfg.is_gateway:
        return
    index = st.bridge.index
    for address in container_addresses(st.ips):
        undo.callback(quietly("delete neighbour", neigh.delete_neigh, st.node, index, address.ip))
        with failing(f"failed to set the neighbour entry of {address.ip} on {st.cfg.bridge}"):
            neigh.replace_learned_neigh(st.node, index, address.ip, st.container_mac)


def ensure_forwarding(ctx: BridgeContext, st: AddState, undo: ExitStack) -> None:
    if not (st.cfg.is_gateway or st.cfg.ip_masq):
        return
    versions = {a.version for a in container_addresses(st.ips)}
    with failing("failed to enable IP forwarding in the node netns"):
        if 4 in versions:
            sysctl.ensure_sysctl("net/ipv4/ip_forward", "1")
        if 6 in versions:
            sysctl.ensure_sysctl("net/ipv6/conf/all/forwarding", "1", missing_ok=True)


def setup_masquerade(ctx: BridgeContext, st: AddState, undo: ExitStack) -> None:
    if not (st.cfg.ip_masq and st.ips):
        return
    undo.callback(quietly("remove masquerade elements", ctx.masq.remove, st.att.tag))
    with failing("failed to set up masquerading"):
        ctx.masq.add(st.att.tag, st.cfg.bridge, masq_pairs(st.ips))


def settle_netpol(ctx: BridgeContext, st: AddState, undo: ExitStack) -> None:
    """With NetworkPolicy enforced: the Pod is isolated before ADD returns, i.e. before its
    containers start (``settle_attached``: the API server learns its addresses only later)."""
    if ctx.netpol is None:
        return
    pod = calc_attached_pod(st.req.env.args, container_addresses(st.ips))
    if pod is None:
        return
    undo.callback(quietly("forget the Pod's addresses", ctx.netpol.detach, st.att.tag))
    ctx.netpol.settle_attached(st.att.tag, pod)


STEPS: tuple[tuple[str, Callable[[BridgeContext, AddState, ExitStack], None]], ...] = (
    ("ensure-bridge", ensure_bridge),
    ("ipam-add", add_ipam),
    ("setup-veth", setup_veth),
    ("setup-port", setup_port),
    ("setup-pod", setup_pod),
    ("ensure-gateway", ensure_gateway),
    ("setup-neighbours", setup_node_neighbours),
    ("ensure-forwarding", ensure_forwarding),
    ("setup-masquerade", setup_masquerade),
    ("settle-netpol", settle_netpol),
)
ADD_STEPS = tuple(name for name, _ in STEPS) + ("finish",)


def run_add(ctx: BridgeContext, req: Request) -> dict:
    cfg = fit_to_node(parse_bridge_config(req), ctx.overlay)
    validate_delegation(ctx.plugins, req, parse=True)
    netns_fd = validate_pod_netns(req)
    att = Attachment.of(req)
    validate_new_attachment(att)
    if ctx.netpol is not None:
        parse_pod_identity(req.env.args)  # a bad Pod name makes nothing
    with node_session() as node, ExitStack() as resources, ExitStack() as undo:
        st = AddState(req, cfg, att, netns_fd, node, resources)
        for name, step in STEPS:
            ctx.faults.point(req, name)
            step(ctx, st, undo)
        ctx.faults.point(req, "finish")
        result = add_result(st)
        undo.pop_all()
    return result


def add_result(st: AddState) -> dict:
    mtu = {"mtu": st.cfg.mtu} if st.cfg.mtu else {}
    return build_result(
        bridge={"name": st.cfg.bridge, "mac": st.bridge.mac},
        host={"name": st.att.host_veth, "mac": st.host_mac, **mtu},
        container={
            "name": st.req.env.ifname,
            "mac": st.container_mac,
            **mtu,
            "sandbox": st.req.env.netns,
        },
        ips=st.ips,
        routes=st.routes,
        dns=st.dns,
    )


def quietly(what: str, fn: Callable, *args) -> Callable[[], None]:
    """An undo that logs its own failure instead of hiding the error that caused the rollback."""

    def undo() -> None:
        try:
            fn(*args)
        except CNIError as err:  # said by the error itself: no stack
            log.warning("rollback: %s failed: %s", what, err)
        except Exception:
            log.exception("rollback: %s failed", what)

    return undo

"""The bridges of this node: created once, race-free, and remembered.

Many ADDs arrive at once: each bridge name has a lock, creation tolerates EEXIST (another
process may win), and what was verified (the bridge's ifindex, MAC, gateway addresses) is
remembered so the next ADD confirms it with cheap ioctls instead of netlink round trips and
address dumps that grow with every pod on the node. Anything that no longer matches (bridge
recreated or down, gateway address gone) falls back to the full, self-healing path.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from pyroute2 import IPRoute

from cni.spec.errors import InvalidConfig
from kernel import addr, ioctl, link, sysctl
from kernel.addr import IPInterface
from plugins.bridge.calc import calc_bridge_conflicts, calc_pod_on_bridge
from plugins.bridge.config import BridgeConfig
from plugins.bridge.errors import failing


@dataclass
class KnownBridge:
    link: link.LinkInfo
    gateways: set = field(default_factory=set)  # pycni's addresses verified on it
    others: set | None = None  # its other addresses at the last look (None: not looked)


class NodeBridges:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._known: dict[str, KnownBridge] = {}

    def lock(self, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(name, threading.Lock())

    def ensure_bridge(self, ipr: IPRoute, cfg: BridgeConfig) -> link.LinkInfo:
        """The bridge, up (and promiscuous with promiscMode), MAC pinned; created if missing."""
        name = cfg.bridge
        with self.lock(name), failing(f"failed to set up bridge {name}"):
            known = self._known.get(name)
            if known and still_current(known.link, cfg.promisc):
                return known.link
            bridge = self._setup(ipr, cfg)
            self._known[name] = KnownBridge(bridge)
            return bridge

    def _setup(self, ipr: IPRoute, cfg: BridgeConfig) -> link.LinkInfo:
        try:
            bridge, created = link.ensure_bridge(ipr, cfg.bridge, cfg.mtu)
        except link.LinkError as exc:
            raise InvalidConfig("invalid key 'bridge'", str(exc)) from None
        link.pin_mac(ipr, bridge)
        if created:  # a bridge someone else made keeps its settings
            sysctl.ensure_sysctl(f"net/ipv6/conf/{bridge.name}/accept_ra", "0", missing_ok=True)
        if cfg.promisc and not bridge.promisc:
            link.set_promisc(ipr, bridge.index)
        return bridge

    def ensure_gateway(
        self,
        ipr: IPRoute,
        bridge: link.LinkInfo,
        wanted: list[IPInterface],
        force: bool,
        pod: Iterable[IPInterface] = (),
    ) -> None:
        """The gateway addresses on the bridge, marked as pycni's (ADDR_PROTO_PYCNI), so it may
        hold several; a same-family address that is not pycni's is an error (code 7) unless
        ``force``, which replaces it. A Pod address the bridge holds is an error (code 7)."""
        with (
            self.lock(bridge.name),
            failing(f"failed to set the gateway address on {bridge.name}"),
        ):
            known = self._known.get(bridge.name)
            if (
                known
                and known.others is not None
                and all(gateway_present(bridge.name, w, known.gateways) for w in wanted)
            ):
                refuse_pod_on_bridge(bridge.name, pod, known.gateways | known.others)
                return
            existing = addr.list_addresses_by_proto(ipr, bridge.index)
            refuse_pod_on_bridge(bridge.name, pod, existing)
            ours = {a for a, proto in existing.items() if proto == addr.ADDR_PROTO_PYCNI}
            ours |= known.gateways & set(existing) if known else set()  # set before marking
            conflicts = calc_bridge_conflicts(set(existing) - ours, wanted)
            if conflicts and not force:
                raise InvalidConfig(
                    f"bridge {bridge.name} already has an address {conflicts[0]} different "
                    f"from {', '.join(map(str, wanted))}",
                    "set forceAddress to replace it",
                )
            for old in conflicts:
                addr.delete_address(ipr, bridge.index, old)
            for address in wanted:
                if address not in existing:
                    addr.add_address(
                        ipr, bridge.index, address, exist_ok=True, proto=addr.ADDR_PROTO_PYCNI
                    )
                elif existing[address] != addr.ADDR_PROTO_PYCNI:  # set before marking began
                    addr.mark_address(ipr, bridge.index, address, addr.ADDR_PROTO_PYCNI)
            if known:
                known.gateways = ours | set(wanted)
                known.others = set(existing) - ours - set(wanted) - set(conflicts)


def refuse_pod_on_bridge(
    name: str, pod: Iterable[IPInterface], bridge: Iterable[IPInterface]
) -> None:
    """InvalidConfig naming a Pod address that is an address of the bridge already."""
    found = calc_pod_on_bridge(pod, bridge)
    if found:
        mine, held = found[0]
        raise InvalidConfig(
            f"the Pod's address {mine} is already an address of bridge {name} ({held})",
            "one address cannot be on two interfaces: if it is a stale gateway, delete it "
            f"from the bridge, or keep {mine.ip} out of the IPAM's pool (pycni ipam pool set "
            f"POOL --exclude {mine.ip})",
        )


def still_current(bridge: link.LinkInfo, promisc: bool) -> bool:
    """The remembered bridge is still there (same ifindex), up, and promiscuous if asked."""
    try:
        index = socket.if_nametoindex(bridge.name)
    except OSError:
        return False
    flags = ioctl.if_flags(bridge.name) or 0
    return (
        index == bridge.index
        and bool(flags & link.IFF_UP)
        and (not promisc or bool(flags & link.IFF_PROMISC))
    )


def gateway_present(name: str, wanted: IPInterface, verified: set) -> bool:
    """Verified before and, for IPv4, the bridge's primary address is still one of pycni's
    verified ones (one ioctl; a bridge may hold several gateways, one of them primary)."""
    if wanted not in verified:
        return False
    return wanted.version == 6 or ioctl.if_primary_ipv4(name) in verified

"""pycni-bridge on a node that runs an overlay: the netconf meets the node's backend.

The backend is the node's (pycnid's ``overlay`` section, ``overlay/config.py``): a netconf
may name it (``"backend": {"type": "vxlan"}``) and must then agree. Without an ``mtu`` the Pod
gets the overlay's (underlay − 50 for VXLAN over IPv4), on both veth ends and on a bridge this
ADD creates; an ``mtu`` above it is refused, since the VXLAN device would drop every full-size
packet the Pod sends. The bridge answers ARP for Pods on other nodes (``proxy_arp``): a Pod
holds its address with the pool's prefix and asks for a remote Pod as on-link, and the node,
whose route to that Pod's block points into the overlay, answers for it — at once
(``proxy_delay`` 0, as Calico sets it): the kernel's default delays a proxied ARP reply by up to
0.8 s, and the first packets to a new remote Pod were lost in the wait.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cni.spec.errors import InvalidConfig
from kernel import sysctl
from plugins.bridge.config import BridgeConfig

RETRANS_MS = 200  # a Pod's neighbour retry on an overlay node (kernel: 1000); whole jiffies
#                   at HZ 100..1000, so the value reads back as written (250 read as 252)


def fit_to_node(cfg: BridgeConfig, overlay: Any) -> BridgeConfig:
    """The netconf as this node runs it: backend checked, MTU derived (``overlay``: the node's
    ``NodeEnd`` or None)."""
    if overlay is None:
        if cfg.backend:
            raise InvalidConfig(
                f"the netconf asks for backend {cfg.backend!r}, but pycnid on "
                "this node runs no overlay",
                'add an "overlay" section to pycnid\'s config '
                f'("backend": "{cfg.backend}") and restart it',
            )
        return cfg
    if cfg.backend and cfg.backend != overlay.backend:
        raise InvalidConfig(
            f"the netconf asks for backend {cfg.backend!r}, but this node's "
            f"overlay is {overlay.backend!r}",
            "the backend is the node's (pycnid's overlay.backend): drop the "
            "netconf's backend or make them agree",
        )
    if cfg.mtu and cfg.mtu > overlay.mtu:
        raise InvalidConfig(
            f"invalid key 'mtu': {cfg.mtu} is above the overlay's MTU {overlay.mtu}",
            f"the {overlay.backend} underlay carries at most "
            f"{overlay.mtu} bytes per Pod packet: leave 'mtu' out to get it",
        )
    return replace(cfg, mtu=cfg.mtu or overlay.mtu)


def ensure_neighbour_proxy(bridge: str, versions: set[int]) -> None:
    """proxy_arp answers for whatever the node routes elsewhere; proxy_ndp for the addresses
    the overlay adds a proxy entry for (remote Pods' IPv6 addresses)."""
    if 4 in versions:
        sysctl.ensure_sysctl(f"net/ipv4/conf/{bridge}/proxy_arp", "1")
        sysctl.ensure_sysctl(f"net/ipv4/neigh/{bridge}/proxy_delay", "0")
    if 6 in versions:  # the kernel delays proxied answers (up to 0.8 s) unless told not to
        sysctl.ensure_sysctl(f"net/ipv6/conf/{bridge}/proxy_ndp", "1", missing_ok=True)
        sysctl.ensure_sysctl(f"net/ipv6/neigh/{bridge}/proxy_delay", "0", missing_ok=True)


def ensure_quick_resolve(ifname: str) -> None:
    """In the Pod: ask again for an unanswered neighbour after 200 ms, not 1 s. A Pod that
    talks to a Pod of a node that joins a moment later asks before its node has the route (and
    the bridge cannot answer for it yet); the kernel's one-second retry was the first reply's
    whole delay."""
    for family in ("ipv4", "ipv6"):
        sysctl.ensure_sysctl(
            f"net/{family}/neigh/{ifname}/retrans_time_ms", str(RETRANS_MS), missing_ok=True
        )

"""Starting the overlay in pycnid: the node's end resolved, then the sync loop.

Runs in pycnid's start-up (``pycnid/wiring.py``) once the lease service exists: the VTEP
addresses are leased through it. The ``overlay`` section comes parsed (``overlay/config.py``,
at load); an underlay address not on this node stops pycnid from starting, naming the key. On
shutdown the sync stops; with ``leaveOnStop`` the node also leaves (VTEP released, node record
removed, its own entries taken out), and peers remove what they had for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from common.metrics import Registry
from ipam.leases.service import LeaseService
from kernel.session import node_session
from masq.table import MasqTable
from nodes.liveness import Liveness
from overlay.config import OverlayConfig, calc_vtep_mac
from overlay.device import NodeEnd, calc_mtu
from overlay.sync import OverlaySync
from overlay.underlay import resolve_underlay
from store.base import Store

log = logging.getLogger("pycnid.overlay")


def resolve_end(
    config: OverlayConfig, node: str, node_address: str | None, fallback: str
) -> NodeEnd:
    """This node's end; ``node_address`` is ``nodeAddress`` as configured (None: not set)."""
    configured = config.underlay_address or node_address
    with node_session() as ipr:
        underlay = resolve_underlay(ipr, configured, fallback or None)
    return NodeEnd(
        config, underlay, config.vtep_mac or calc_vtep_mac(node), calc_mtu(config, underlay)
    )


def start_overlay(
    config: OverlayConfig | None,
    node_address: str | None,
    node: str,
    store: Store,
    leases: LeaseService,
    liveness: Liveness,
    registry: Registry,
    on_shutdown: list[Callable[[], None]],
    masq: MasqTable,
) -> NodeEnd | None:
    """The overlay of this node, started; None when the config has no ``overlay``. It keeps
    the cluster's pools in the masquerade table through ``masq``, the table's one writer."""
    if config is None:
        return None
    end = resolve_end(config, node, node_address, liveness.record.address)
    sync = OverlaySync(
        end, node, store, leases, lambda info: liveness.update(overlay=info), registry, masq
    ).start()
    log.info(
        "overlay %s on %s (%s, MTU %d)",
        end.backend,
        end.underlay.address,
        end.underlay.ifname,
        end.mtu,
    )
    masq.follow_cluster(sync.pool_cidrs)  # what pycni-bridge's ipMasq spares

    def stop() -> None:
        sync.stop()
        if config.leave_on_stop:
            liveness.leave()
            sync.leave()

    on_shutdown.append(stop)
    return end

"""Starting the overlay in pycnid: the node's end resolved, then the sync loop.

Runs in pycnid's start-up (``pycnid/wiring.py``) once the lease service exists: the VTEP
addresses are leased through it. Config errors (``overlay`` section, underlay address not on
this node) stop pycnid from starting, naming the key. On shutdown the sync stops; with
``leaveOnStop`` the node also leaves (VTEP released, node record removed, its own entries
taken out), and peers remove what they had for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ipam.leases.service import LeaseService
from kernel.session import node_session
from nodes.liveness import Liveness
from overlay.config import OverlayConfig, calc_vtep_mac, parse_overlay_config
from overlay.device import NodeEnd, calc_mtu
from overlay.sync import OverlaySync
from overlay.underlay import resolve_underlay
from store.base import Store

log = logging.getLogger("pycnid.overlay")


def resolve_end(
    config: OverlayConfig, node: str, raw: Mapping[str, Any], fallback: str
) -> NodeEnd:
    configured = config.underlay_address or raw.get("nodeAddress")
    with node_session() as ipr:
        underlay = resolve_underlay(ipr, configured, fallback or None)
    return NodeEnd(
        config, underlay, config.vtep_mac or calc_vtep_mac(node), calc_mtu(config, underlay)
    )


def start_overlay(
    raw: Mapping[str, Any],
    node: str,
    store: Store,
    leases: LeaseService,
    liveness: Liveness,
    registry: Any,  # a common.metrics.Registry (pycnid/wiring.py: MetricsRegistry)
    on_shutdown: list[Callable[[], None]],
) -> NodeEnd | None:
    """The overlay of this node, started; None when the config has no ``overlay``."""
    config = parse_overlay_config(raw)
    if config is None:
        return None
    end = resolve_end(config, node, raw, liveness.record.address)
    sync = OverlaySync(
        end, node, store, leases, lambda info: liveness.update(overlay=info), registry
    ).start()
    log.info(
        "overlay %s on %s (%s, MTU %d)",
        end.backend,
        end.underlay.address,
        end.underlay.ifname,
        end.mtu,
    )
    end = replace(end, cluster_cidrs=sync.pool_cidrs)  # what pycni-bridge's ipMasq spares

    def stop() -> None:
        sync.stop()
        if config.leave_on_stop:
            liveness.leave()
            sync.leave()

    on_shutdown.append(stop)
    return end

"""Starting NetworkPolicy enforcement in pycnid, from the ``networkPolicy`` section.

The section is parsed at load (``netpol/config.py``); here the sync starts when ``enforce``
is on, and its stop goes on pycnid's shutdown list. Stopping leaves the table in place: the
kernel keeps enforcing the last rendered policies while pycnid is away.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from common.metrics import Registry
from kube.source import KubeSource
from netpol.config import NetpolConfig
from store.base import Store

if TYPE_CHECKING:
    from netpol.sync import NetpolSync

log = logging.getLogger("pycnid.netpol")


def start_netpol(
    config: NetpolConfig | None,
    node: str,
    store: Store,
    registry: Registry,
    on_shutdown: list[Callable[[], None]],
    node_address: str | None = None,
    source: KubeSource | None = None,
) -> NetpolSync | None:
    """This node's enforcement, started; None when the config does not turn it on. With
    ``source``, Pods, Namespaces and NetworkPolicies come from the API server."""
    if config is None:
        return None
    from netpol.sync import NetpolSync  # loaded here: a pycnid without the section never pays it

    sync = NetpolSync(
        node,
        store,
        registry,
        config.resync_interval,
        node_address,
        purge=config.purge,
        kube=source,
    ).start()
    on_shutdown.append(sync.stop)
    log.info(
        "NetworkPolicy enforcement on (full render every %.0fs, existing connections %s)",
        config.resync_interval,
        "purged when denied" if config.purge else "kept",
    )
    return sync

"""Starting the Service proxy in pycnid, from the ``services`` section of its config.

The section is parsed at load (``services/proxy/config.py``); here the proxy starts when it
is on, and its stop goes on pycnid's shutdown list. With a ``kubernetes`` section
(``kube/config.py``) the proxy's Services and endpoints come from the API server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from common.metrics import Registry
from kube.source import KubeSource
from services.proxy.config import ProxyConfig
from services.proxy.sync import ProxySync
from store.base import Store

log = logging.getLogger("pycnid.proxy")


def start_proxy(
    config: ProxyConfig | None,
    node: str,
    store: Store,
    registry: Registry,
    on_shutdown: list[Callable[[], None]],
    source: KubeSource | None = None,
) -> ProxySync | None:
    """The proxy of this node, started; None when the config does not turn it on. With
    ``source``, Services and EndpointSlices come from the API server (``kube/source.py``;
    pycnid starts the source once every consumer asked for its kinds)."""
    if config is None:
        return None
    sync = ProxySync(node, store, registry, config.resync_interval, config, source).start()
    on_shutdown.append(sync.stop)
    if source is not None:
        log.info("Service proxy: Services and EndpointSlices from %s", source.api.host)
    log.info("Service proxy on (full render every %.0fs)", config.resync_interval)
    return sync

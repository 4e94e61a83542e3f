"""What pycni-bridge's ADD steps and CHECK need of the handler, as one small typed value.

``BridgePlugin`` (plugin.py) builds it once and hands it to ``run_add`` (add.py) and
``run_check`` (check.py); the steps import this module, never plugin.py, so plugin.py imports
them and nothing imports it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from masq.table import MasqTable
    from overlay.device import NodeEnd
    from plugins.base import Faults, Plugin, PodIsolation
    from plugins.bridge.node import NodeBridges


@dataclass(frozen=True)
class BridgeContext:
    """The other handlers (IPAM is delegated to in-process; pycnid fills the dict once every
    handler exists), the test fault hook, the masquerade table's writer, the node's bridges,
    the node's overlay end (None without an overlay), and NetworkPolicy enforcement (None
    when the node does not enforce it)."""

    plugins: dict[str, Plugin]
    faults: Faults
    masq: MasqTable
    bridges: NodeBridges
    overlay: NodeEnd | None
    netpol: PodIsolation | None = None

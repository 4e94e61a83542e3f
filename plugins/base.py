"""What every plugin handler offers the daemon, and the dependencies the daemon lends it.

pycnid builds one ``HandlerDeps`` at start-up (``pycnid/wiring.py``): the store and the
node's loops on it are open and started before any handler exists, so a handler only reads
typed fields. The metrics registry is the daemon's; handlers see it through ``MetricsRegistry``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from cni.spec.errors import InternalError
from cni.spec.request import Request

if TYPE_CHECKING:
    from ipam.leases.service import LeaseService
    from masq.table import MasqTable
    from netpol.attached import AttachedPod
    from nodes.context import NodeContext
    from overlay.device import NodeEnd
    from store.base import Store

GaugeValues = Mapping[tuple[tuple[str, str], ...], float]  # label pairs (sorted) -> value


class Plugin(Protocol):
    """One plugin type. ADD returns a canonical (1.1.0-shaped) result; the rest return None."""

    def add(self, req: Request) -> dict: ...

    def delete(self, req: Request) -> None: ...

    def check(self, req: Request) -> None: ...

    def status(self, req: Request) -> None: ...

    def gc(self, req: Request) -> None: ...

    def close(self) -> None:
        """Release what the handler holds itself (pycnid's shutdown, in reverse order)."""


class PodIsolation(Protocol):
    """NetworkPolicy enforcement as the ADDs see it (``netpol/sync.py``): pycni-svc's settles
    its endpoint record (the store's model), pycni-bridge's the addresses it assigned to a
    Kubernetes Pod (the API server's model, which learns them only after the ADD); DEL and a
    rolled-back ADD detach them."""

    def settle(self, key: str, value: bytes) -> None: ...

    def settle_attached(self, key: str, pod: AttachedPod) -> None: ...

    def detach(self, key: str) -> None: ...


class Counter(Protocol):
    def inc(self, amount: float = 1.0, **labels: str) -> None: ...


class Gauge(Protocol):
    def set(self, value: float, **labels: str) -> None: ...


class Histogram(Protocol):
    def observe(self, value: float, **labels: str) -> None: ...


class MetricsRegistry(Protocol):
    """What handlers need from pycnid's registry (``common.metrics.Registry``)."""

    def counter(self, name: str, help_text: str) -> Counter: ...

    def gauge(
        self, name: str, help_text: str, collect: Callable[[], GaugeValues] | None = None
    ) -> Gauge: ...

    def histogram(self, name: str, help_text: str) -> Histogram: ...


class InjectedFault(InternalError):
    """Raised at a named step when a test asked for it (daemon started with fault injection)."""


@dataclass
class Faults:
    """Test-only fault hook: fail the step named by CNI_ARGS `PYCNI_FAULT=<step>`, or kill
    pycnid there with `PYCNI_FAULT=kill@<step>` (SIGKILL: a crash mid-request, for the drills).

    Active only when pycnid runs with `faultInjection: true`; steps are listed so tests can
    fail each in turn (`steps_seen` records which points a request passed).
    """

    enabled: bool = False
    steps_seen: list[str] = field(default_factory=list)

    def point(self, req: Request, step: str) -> None:
        if not self.enabled:
            return
        self.steps_seen.append(step)
        fault = req.env.args.get("PYCNI_FAULT")
        if fault == step:
            raise InjectedFault(f"injected fault at step {step!r}")
        if fault == f"kill@{step}":
            os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class HandlerDeps:
    """What the daemon lends to plugin handlers: who this node is, test faults, the metrics
    registry, the store, the lease service and the node's context on it, the masquerade
    table's writer, and the other handlers (the bridge
    delegates to IPAM in-process; pycnid fills ``plugins`` once every handler exists)."""

    node_name: str
    faults: Faults
    metrics: MetricsRegistry
    store: Store
    leases: LeaseService
    node: NodeContext
    masq: MasqTable  # the masquerade table's one writer (the overlay writes through it too)
    plugins: dict[str, Plugin] = field(default_factory=dict)
    overlay: NodeEnd | None = None  # the node's overlay end (backend, MTU), if it runs one
    netpol: PodIsolation | None = None  # NetworkPolicy enforcement, when the node runs it

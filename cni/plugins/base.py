"""What every plugin handler offers the daemon, and the services the daemon lends it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from cni.spec.errors import InternalError
from cni.spec.request import Request


class Plugin(Protocol):
    """One plugin type. ADD returns a canonical (1.1.0-shaped) result; the rest return None."""

    def add(self, req: Request) -> dict: ...

    def delete(self, req: Request) -> None: ...

    def check(self, req: Request) -> None: ...

    def status(self, req: Request) -> None: ...

    def gc(self, req: Request) -> None: ...


class InjectedFault(InternalError):
    """Raised at a named step when a test asked for it (daemon started with fault injection)."""


@dataclass
class Faults:
    """Test-only fault hook: fail the step named by CNI_ARGS `PYCNI_FAULT=<step>`.

    Active only when pycnid runs with `faultInjection: true`; steps are listed so tests can
    fail each in turn (`steps_seen` records which points a request passed).
    """

    enabled: bool = False
    steps_seen: list[str] = field(default_factory=list)

    def point(self, req: Request, step: str) -> None:
        if not self.enabled:
            return
        self.steps_seen.append(step)
        if req.env.args.get("PYCNI_FAULT") == step:
            raise InjectedFault(f"injected fault at step {step!r}")


def _registry() -> Any:
    from ipam.daemon.metrics import Registry

    return Registry()


@dataclass
class Services:
    """What the daemon lends to plugin handlers (mechanisms and shared state)."""

    node_name: str
    faults: Faults
    metrics: Any = field(default_factory=_registry)  # ipam.daemon.metrics.Registry
    plugins: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    on_shutdown: list[Callable[[], None]] = field(default_factory=list)

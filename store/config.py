"""Which store a daemon (or `pycni ipam`) opens: the `store` object of pycnid's config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StoreConfig:
    """`{"type": "sqlite", "path": ...}` or
    `{"type": "etcd", "endpoints": [...], "ca"/"cert"/"key"}`.

    ``path`` (SQLite) is the database file; the daemon config derives it from `stateDir`."""

    type: str = "sqlite"
    path: str = ""
    endpoints: tuple[str, ...] = ()
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

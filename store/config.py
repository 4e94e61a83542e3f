"""Which store a daemon (or `pycni ipam`) opens: the `store` object of pycnid's config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StoreConfig:
    """`{"type": "sqlite", "path": ...}` or
    `{"type": "etcd", "endpoints": [...], "ca"/"cert"/"key", "username"/"passwordFile"}`.

    ``path`` (SQLite) is the database file; the daemon config derives it from `stateDir`.
    ``password_file`` is where the etcd user's password is: the password itself is never held
    here, so no repr or log of the config can show it (store/etcd_auth.py reads it)."""

    type: str = "sqlite"
    path: str = ""
    endpoints: tuple[str, ...] = ()
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    username: str | None = None
    password_file: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

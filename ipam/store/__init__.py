"""Key-value stores behind one small interface (``base.Store``): embedded SQLite and etcd."""
from __future__ import annotations

from .base import Store
from .config import StoreConfig


def open_store(config: StoreConfig) -> Store:
    """Build the store the daemon config names (imports etcd only when asked for)."""
    if config.type == "etcd":
        from .etcd import EtcdStore

        return EtcdStore.from_config(config)
    from .sqlite import SqliteStore

    return SqliteStore(config.path)

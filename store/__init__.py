"""Key-value stores behind one small interface (``base.Store``): embedded SQLite and etcd."""

from __future__ import annotations

from store.base import Store
from store.config import StoreConfig


def open_store(config: StoreConfig) -> Store:
    """Build the store the daemon config names (imports etcd only when asked for)."""
    if config.type == "etcd":
        from store.etcd import EtcdStore

        return EtcdStore.from_config(config)
    from store.sqlite import SqliteStore

    return SqliteStore(config.path)

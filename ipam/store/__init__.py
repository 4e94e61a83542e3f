"""Key-value stores behind one small interface (``base.Store``): embedded SQLite and etcd."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Store

if TYPE_CHECKING:  # the store layer never imports the daemon; its config is only a type here
    from ipam.daemon.config import StoreConfig


def open_store(config: StoreConfig) -> Store:
    """Build the store the daemon config names (imports etcd only when asked for)."""
    if config.type == "etcd":
        from .etcd import EtcdStore

        return EtcdStore.from_config(config)
    from .sqlite import SqliteStore

    return SqliteStore(config.path)

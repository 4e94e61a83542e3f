"""Which store `pycni ipam` talks to: the daemon config's, or one named on the command line.

Order: ``--store-path`` (a SQLite file), else ``--etcd-endpoints`` (TLS files from
``--etcd-ca/--etcd-cert/--etcd-key`` or the daemon config), else the store of the daemon
config ``--config`` (default /etc/pycni/pycnid.json; when that default file is absent, the
built-in defaults: SQLite at /var/lib/pycni/store.db). A SQLite file is never created here:
an operator tool pointed at the wrong path must say so, not show an empty cluster. The daemon
config is the ``DaemonConfig`` pycnid itself loads (``pycnid/config.py``): one parser, the same
errors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cni.spec.errors import InvalidConfig
from pycnid.config import (
    DEFAULT_CONFIG_PATH,
    DaemonConfig,
    load_daemon_config,
    parse_daemon_config,
)
from store.base import Store
from store.config import StoreConfig


@dataclass(frozen=True)
class StoreOptions:
    config: str | None = None  # None: the default path, which may be absent
    etcd_endpoints: str | None = None  # comma-separated
    store_path: str | None = None
    etcd_ca: str | None = None
    etcd_cert: str | None = None
    etcd_key: str | None = None


def load_config(opts: StoreOptions, sections: bool = False) -> DaemonConfig:
    """pycnid's config as the CLI reads it: its own keys, its sections only when asked."""
    if opts.config is not None:
        return load_daemon_config(opts.config, sections)
    if os.path.exists(DEFAULT_CONFIG_PATH):
        return load_daemon_config(DEFAULT_CONFIG_PATH, sections)
    return parse_daemon_config({})


def calc_store_config(opts: StoreOptions, config: DaemonConfig) -> StoreConfig:
    if opts.store_path:
        return StoreConfig(type="sqlite", path=opts.store_path)
    if opts.etcd_endpoints:
        endpoints = tuple(e.strip() for e in opts.etcd_endpoints.split(",") if e.strip())
        if not endpoints:
            raise InvalidConfig("invalid --etcd-endpoints", "expected http(s)://host:port,...")
        base = config.store if config.store.type == "etcd" else StoreConfig(type="etcd")
        return StoreConfig(
            type="etcd",
            endpoints=endpoints,
            ca=opts.etcd_ca or base.ca,
            cert=opts.etcd_cert or base.cert,
            key=opts.etcd_key or base.key,
            options=dict(base.options),
        )
    store = config.store
    if store.type == "etcd" and (opts.etcd_ca or opts.etcd_cert or opts.etcd_key):
        return StoreConfig(
            type="etcd",
            endpoints=store.endpoints,
            ca=opts.etcd_ca or store.ca,
            cert=opts.etcd_cert or store.cert,
            key=opts.etcd_key or store.key,
            options=dict(store.options),
        )
    return store


def describe_store(config: StoreConfig) -> str:
    if config.type == "etcd":
        return "etcd:" + ",".join(config.endpoints)
    return f"sqlite:{config.path}"


def open_configured(store_config: StoreConfig) -> Store:
    """The store ``calc_store_config`` chose (etcd imported only when asked for)."""
    if store_config.type == "etcd":
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # errors are ours to tell, once
        from store.etcd import EtcdStore

        return EtcdStore.from_config(store_config)
    return open_sqlite(store_config.path)


def open_sqlite(path: str) -> Store:
    from store.sqlite import SqliteStore

    if not os.path.isfile(path):
        raise InvalidConfig(
            f"store sqlite:{path} does not exist",
            "is pycnid configured with it? pass --store-path or --config",
        )
    return SqliteStore(path)  # an unusable file is TryAgainLater naming the store

"""Which store `pycni ipam` talks to: the daemon config's, or one named on the command line.

Order: ``--store-path`` (a SQLite file), else ``--etcd-endpoints`` (TLS files from
``--etcd-ca/--etcd-cert/--etcd-key``, the etcd user from ``--etcd-username`` and
``--etcd-password-file``, each else the daemon config's), else the store of the daemon
config ``--config`` (default /etc/pycni/pycnid.json; when that default file is absent, the
built-in defaults: SQLite at /var/lib/pycni/store.db). A SQLite file is never created here:
an operator tool pointed at the wrong path must say so, not show an empty cluster. The daemon
config is the ``DaemonConfig`` pycnid itself loads (``pycnid/config.py``): one parser, the same
errors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

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
    etcd_username: str | None = None
    etcd_password_file: str | None = None  # the password is only ever read from a file


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
        return over_etcd(opts, replace(base, endpoints=endpoints))
    if config.store.type == "etcd":
        return over_etcd(opts, config.store)
    return config.store


def over_etcd(opts: StoreOptions, store: StoreConfig) -> StoreConfig:
    """The command line's etcd credentials over the config's (code 7 when only half a user)."""
    chosen = replace(
        store,
        type="etcd",
        ca=opts.etcd_ca or store.ca,
        cert=opts.etcd_cert or store.cert,
        key=opts.etcd_key or store.key,
        username=opts.etcd_username or store.username,
        password_file=opts.etcd_password_file or store.password_file,
        options=dict(store.options),
    )
    if bool(chosen.username) != bool(chosen.password_file):
        raise InvalidConfig(
            "invalid --etcd-username/--etcd-password-file",
            "etcd user authentication needs both a user name and a password file",
        )
    return chosen


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

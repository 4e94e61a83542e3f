"""Fixtures for the operator-tool tests (`pycni ipam`): an empty store of each kind.

``store`` runs a test on a fresh SQLite file and on the session's real etcd (emptied first);
``sqlite_path`` / ``etcd_endpoints`` are what a `pycni ipam` command line names.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from cli import cli
from store.sqlite import SqliteStore
from tests.fixtures.etcd import wipe_all_keys


@pytest.fixture
def sqlite_path(tmp_path) -> str:
    path = str(tmp_path / "store.db")
    SqliteStore(path).close()  # pycnid creates it; the CLI never does
    return path


@pytest.fixture
def etcd_endpoints(etcd_shared) -> str:
    wipe_all_keys(etcd_shared)
    return ",".join(etcd_shared.endpoints)


@pytest.fixture(params=["sqlite", pytest.param("etcd", marks=pytest.mark.etcd)])
def store_kind(request) -> str:
    return request.param


@pytest.fixture
def store(request, store_kind) -> Iterator:
    """An empty store (a fresh SQLite file, or the shared etcd wiped)."""
    if store_kind == "sqlite":
        s = SqliteStore(request.getfixturevalue("sqlite_path"))
    else:
        from store.etcd import EtcdStore

        s = EtcdStore(request.getfixturevalue("etcd_endpoints").split(","))
    yield s
    s.close()


@pytest.fixture
def store_args(request, store_kind) -> list[str]:
    """The `pycni ipam` options naming the same store as ``store``."""
    if store_kind == "sqlite":
        return ["--store-path", request.getfixturevalue("sqlite_path")]
    return ["--etcd-endpoints", request.getfixturevalue("etcd_endpoints")]


@pytest.fixture
def svc(store_args):
    """`pycni svc ARGS` against the test's store: its JSON answer (``text``: its text), or
    with ``code`` its error output."""
    runner = CliRunner()

    def run(*args: str, code: int = 0, text: bool = False):
        output = [] if text else ["-o", "json"]
        result = runner.invoke(cli, ["svc", *args, *store_args, *output], catch_exceptions=False)
        assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
        if code:
            return result.stderr
        return result.stdout if text else json.loads(result.stdout)

    return run

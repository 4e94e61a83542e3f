"""Shared fixtures. Privileged ones skip cleanly when not root; everything they make is removed."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import settings

from cni.launcher import write_launchers
from tests.fixtures import netns as netns_mod
from tests.fixtures.daemon import Pycnid, daemon_config
from tests.fixtures.plugins import REFERENCE_BIN

# The modules that define fixtures, registered for every test (pytest reads pytest_plugins in
# the top-level conftest only): a test names the fixture as a parameter and imports nothing.
# etcd before cluster and kubeapi: both import etcd, and a plugin module imported before it is
# registered cannot be assertion-rewritten (pytest warns, and warnings are errors here).
pytest_plugins = (
    "tests.fixtures.etcd",
    "tests.fixtures.bridge",
    "tests.fixtures.cluster",
    "tests.fixtures.kubeapi",
    "tests.fixtures.rootns",  # autouse, session-wide: the root netns is left as it was
    "tests.fixtures.doctor",
)

# No property times its examples: hypothesis' default 200 ms deadline is a timed assertion,
# and on two shared cores beside CI's other worker one example of an nft or netns property
# can take longer. The fuzz budgets (tests/fuzz/budget.py) set their own settings explicitly.
settings.register_profile("pycni-default", deadline=None)
settings.load_profile("pycni-default")

IS_ROOT = os.geteuid() == 0
ETCD_FIXTURES = frozenset(
    {
        "etcd_server",
        "etcd_shared",
        "etcd_cluster",
        "etcd_tls",
        "etcd_auth",
        "etcd_auth_cluster",
        "make_etcd_auth",
        "open_etcd_store",
        "shared_etcd_store",
        "etcd_for_stores",
        "etcd_endpoints",
        "make_cluster",
    }
)


def starts_etcd(item: pytest.Item) -> bool:
    """A test that uses a real-etcd fixture, or runs on the ``etcd`` param of a store fixture."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    uses = ETCD_FIXTURES & set(getattr(item, "fixturenames", ()))
    return bool(uses) or any(value == "etcd" for value in params.values())


def pytest_configure(config: pytest.Config) -> None:
    # registered here, beside tests/fixtures/scale.py, which it goes with
    config.addinivalue_line(
        "markers",
        "long: has a long version, sized by tests/fixtures/scale.py (`make long` runs it)",
    )
    config.addinivalue_line(
        "markers",
        "drill: a fault drill that prints 'N tried, N survived, 0 lost' (`make drills`: long)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that starts a real etcd carries the ``etcd`` marker (``-m "not etcd"``)."""
    unmarked = [
        item.nodeid
        for item in items
        if starts_etcd(item) and item.get_closest_marker("etcd") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "tests that start a real etcd lack the etcd marker: " + ", ".join(unmarked)
        )


@pytest.fixture(scope="session")
def cni_bin(tmp_path_factory) -> str:
    """A CNI bin dir with our launchers (as `make install` writes them)."""
    path = str(tmp_path_factory.mktemp("cni-bin"))
    write_launchers(path)
    return path


@pytest.fixture(scope="session")
def cni_path(cni_bin) -> str:
    """CNI_PATH: ours first, then the reference plugins."""
    return f"{cni_bin}:{REFERENCE_BIN}"


@pytest.fixture(scope="session", autouse=True)
def _remove_namespaces_at_exit():
    yield
    if IS_ROOT:
        netns_mod.cleanup_all()


@pytest.fixture
def netns_factory():
    if not IS_ROOT:
        pytest.skip("needs root for network namespaces")
    made = []

    def make(role: str = "pod"):
        ns = netns_mod.new_netns(role)
        made.append(ns)
        return ns

    yield make
    for ns in reversed(made):
        ns.delete()


@pytest.fixture
def node(netns_factory):
    """A "node" namespace with forwarding on, where pycnid and the bridge live."""
    ns = netns_factory("node")
    ns.run("sysctl -qw net.ipv4.ip_forward=1")
    return ns


@pytest.fixture
def pycnid(node):
    """A real pycnid inside the node namespace, SQLite store, fault injection on."""
    workdir = tempfile.mkdtemp(prefix="pycnid-")
    daemon = Pycnid(node=node, workdir=workdir, config=daemon_config(workdir))
    daemon.start()
    yield daemon
    daemon.stop()
    shutil.rmtree(workdir, ignore_errors=True)

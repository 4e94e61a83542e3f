"""pycnid on a fresh state directory: after ADDs every file under it is 0600, every directory
0700 (the store's WAL and SHM included), and nothing outside it changed mode."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.fixtures.bridge import BridgeNode, bridge_conf, pycni_ipam
from tests.fixtures.daemon import Pycnid, daemon_config
from tests.fixtures.modes import not_private

pytestmark = pytest.mark.netns


@pytest.fixture
def fresh_state(node):
    """pycnid whose stateDir (two levels) does not exist yet; the config and log stay outside."""
    workdir = tempfile.mkdtemp(prefix="pycnid-modes-")
    state = os.path.join(workdir, "var", "pycni")
    config = daemon_config(workdir, stateDir=state, store={"type": "sqlite"})
    config["socket"] = os.path.join(state, "pycnid.sock")
    daemon = Pycnid(node=node, workdir=workdir, config=config)
    try:
        yield daemon.start(), state
    finally:
        daemon.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_fresh_state_dir_is_private_after_adds(
    fresh_state, node, cni_bin, cni_path, netns_factory
):
    daemon, state = fresh_state
    bridge = BridgeNode(
        node=node,
        socket=daemon.socket,
        exe=os.path.join(cni_bin, "pycni-bridge"),
        cni_path=cni_path,
        store_path=os.path.join(state, "store.db"),
        host_local_dir=os.path.join(daemon.workdir, "host-local"),
    )
    for _ in range(3):
        bridge.add(bridge_conf(pycni_ipam()), netns_factory("pod"))
    files = set(os.listdir(state))
    assert {"store.db", "store.db-wal", "store.db-shm", "pycnid.sock"} <= files, files
    assert not_private(os.path.join(daemon.workdir, "var")) == {}

"""`pycni ipam pool set` counts from the very next ADD through pycnid and the real pycni-bridge,
on SQLite and on etcd: an ADD refused because the pool handed out no gateway succeeds right
after ``pool set P --gateway first``, and one after ``--gateway none`` is refused again (issue
18: the refusal outlived the change by about 7 s on SQLite, the pool list's 5 s timer)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

import pytest

from tests.fixtures.bridge import BridgeNode, new_cid
from tests.fixtures.daemon import Pycnid, daemon_config
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.netns import Netns
from tests.netns.test_bridge_gateway import cluster_conf

pytestmark = pytest.mark.netns
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(params=["sqlite", pytest.param("etcd", marks=pytest.mark.etcd)])
def daemon(request, node: Netns) -> Iterator[Pycnid]:
    """pycnid in the node namespace on SQLite, or on an etcd running in that namespace."""
    workdir = tempfile.mkdtemp(prefix="pycnid-poolchange-")
    server = EtcdServer("etcd-node", netns=node.name) if request.param == "etcd" else None
    pycnid: Pycnid | None = None
    try:
        store = {"type": "etcd", "endpoints": server.start().endpoints} if server else None
        pycnid = Pycnid(node=node, workdir=workdir, config=daemon_config(workdir, store=store))
        yield pycnid.start()
    finally:
        if pycnid is not None:
            pycnid.stop()
        if server is not None:
            server.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


def pool_cli(daemon: Pycnid, *args: str) -> None:
    """`pycni ipam pool ARGS` in the node namespace with the daemon's config (as an operator)."""
    out = daemon.node.run(
        [
            sys.executable,
            "-m",
            "cli",
            "ipam",
            "pool",
            *args,
            "--config",
            f"{daemon.workdir}/pycnid.json",
        ],
        check=False,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_gateway_change_counts_from_the_next_add(daemon, cni_bin, cni_path, netns_factory):
    bridge = BridgeNode(
        node=daemon.node,
        socket=daemon.socket,
        exe=os.path.join(cni_bin, "pycni-bridge"),
        cni_path=cni_path,
        store_path="",
        host_local_dir="",
    )
    pool_cli(daemon, "add", "chg", "--cidr", "10.129.40.0/28", "--gateway", "none")
    conf = cluster_conf("chg", name="chgnet")
    refused = bridge.run("ADD", conf, new_cid(), netns_factory("pod").path)
    assert refused.error_code() == 7 and "hands out no gateway" in refused.json["msg"]

    pool_cli(daemon, "set", "chg", "--gateway", "first")
    _, result = bridge.add(conf, netns_factory("pod"))  # at once: no sleep, no retry
    assert result["ips"][0]["gateway"].startswith("10.129.40.")

    pool_cli(daemon, "set", "chg", "--gateway", "none")
    again = bridge.run("ADD", conf, new_cid(), netns_factory("pod").path)
    assert again.error_code() == 7 and "hands out no gateway" in again.json["msg"]

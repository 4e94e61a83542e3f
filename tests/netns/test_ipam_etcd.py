"""pycni-ipam served by a pycnid whose store is a real etcd (both inside the node namespace):
leases work, STATUS is 50 and ADD 11 while etcd is down, and both recover once it is back."""

from __future__ import annotations

import shutil
import tempfile
import time

import pytest

from tests.fixtures.daemon import Pycnid, daemon_config
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.ipam import addresses, ipam_conf, run_ipam

pytestmark = [pytest.mark.netns, pytest.mark.etcd]


@pytest.fixture
def etcd_in_node(node):
    server = EtcdServer("etcd-node", netns=node.name)
    try:
        yield server.start()
    finally:
        server.cleanup()


@pytest.fixture
def pycnid_etcd(node, etcd_in_node):
    workdir = tempfile.mkdtemp(prefix="pycnid-etcd-")
    config = daemon_config(
        workdir,
        store={"type": "etcd", "endpoints": etcd_in_node.endpoints},
        ipam={"bufferSize": 0},
    )  # no outage buffer: ADD answers 11 at once
    daemon = Pycnid(node=node, workdir=workdir, config=config)
    daemon.start()
    yield daemon
    daemon.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def test_leases_on_etcd_and_outage_answers(cni_bin, pycnid_etcd, etcd_in_node, netns_factory):
    pod = netns_factory("pod")
    conf = ipam_conf("1.1.0", ranges=[[{"subnet": "10.69.0.0/24"}], [{"subnet": "fd69::/64"}]])
    add = run_ipam(cni_bin, pycnid_etcd, "ADD", conf, cid="c1", netns=pod.path)
    assert add.ok, add.stdout + pycnid_etcd.log()[-2000:]
    assert addresses(add.json) == ["10.69.0.2/24", "fd69::2/64"]
    assert run_ipam(cni_bin, pycnid_etcd, "STATUS", conf).ok

    etcd_in_node.stop()
    started = time.monotonic()
    status = run_ipam(cni_bin, pycnid_etcd, "STATUS", conf)
    assert status.error_code() == 50 and "etcd" in status.json["msg"]
    assert time.monotonic() - started < 5
    down = run_ipam(cni_bin, pycnid_etcd, "ADD", conf, cid="c2", netns=pod.path)
    assert down.error_code() == 11, down.stdout

    etcd_in_node.start()
    deadline = time.monotonic() + 20
    while not run_ipam(cni_bin, pycnid_etcd, "STATUS", conf).ok:
        assert time.monotonic() < deadline, "STATUS did not recover after etcd came back"
        time.sleep(0.3)
    again = run_ipam(cni_bin, pycnid_etcd, "ADD", conf, cid="c2", netns=pod.path)
    assert addresses(again.json) == ["10.69.0.3/24", "fd69::3/64"]
    assert run_ipam(cni_bin, pycnid_etcd, "DEL", conf, cid="c1").ok
    assert run_ipam(cni_bin, pycnid_etcd, "DEL", conf, cid="c2").ok

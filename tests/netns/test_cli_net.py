"""`pycni net` against the reference plugins in real namespaces (run inside the node netns)."""

from __future__ import annotations

import json
import os
import pathlib
import stat

import pytest

from cni.runtime.tool import container_id_for
from tests.fixtures.cnirun import Runner, cache_entry_path, pod_ipv4, write_network
from tests.fixtures.plugins import REFERENCE_BIN

pytestmark = pytest.mark.netns


def bridge_hostlocal(
    name: str, data_dir: str, version: str = "1.0.0", subnet: str = "10.77.0.0/24"
) -> dict:
    return {
        "cniVersion": version,
        "name": name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "clibr0",
                "isDefaultGateway": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": data_dir,
                    "ranges": [[{"subnet": subnet}]],
                },
            }
        ],
    }


@pytest.fixture
def net(node, tmp_path):
    conf_dir, cache_dir, data_dir = (str(tmp_path / d) for d in ("net.d", "cache", "ipam"))
    write_network(conf_dir, bridge_hostlocal("clinet", data_dir))
    runner = Runner("pycni", node, conf_dir, cache_dir, REFERENCE_BIN)
    runner.leases = lambda: (
        sorted(f for f in os.listdir(os.path.join(data_dir, "clinet")) if f[0].isdigit())
        if os.path.isdir(os.path.join(data_dir, "clinet"))
        else []
    )
    return runner


def test_add_check_del_with_the_reference_bridge(net, node, netns_factory):
    pod = netns_factory("pod")
    added = net.must("add", "clinet", pod.path)
    result = added.json
    assert added.stdout.startswith('{\n    "cniVersion": "1.0.0"')
    ip = pod_ipv4(result)
    assert pod.ping("10.77.0.1"), "pod cannot reach its gateway"
    assert node.ping(ip)
    entry = cache_entry_path(net.cache_dir, "clinet", pod.path)
    assert stat.S_IMODE(os.stat(entry).st_mode) == 0o600
    cached = json.loads(pathlib.Path(entry).read_bytes())
    assert cached["result"] == result and cached["containerId"] == container_id_for(pod.path)
    assert cached["netns"] == pod.path
    assert net.leases() == [ip]

    net.must("check", "clinet", pod.path)  # the bridge requires prevResult: read from cache
    net.must("status", "clinet", pod.path)  # 1.0.0 list: STATUS is a no-op, as in libcni

    assert net.must("del", "clinet", pod.path).stdout == ""
    assert "eth0" not in pod.links()
    assert not os.path.exists(entry) and net.leases() == []
    net.must("del", "clinet", pod.path)  # a repeated DEL is fine


def test_second_interface_and_gc_of_every_cached_attachment(net, node, netns_factory):
    pods = [netns_factory("pod") for _ in range(2)]
    for pod in pods:
        net.must("add", "clinet", pod.path)
    net.must("add", "clinet", pods[0].path, ifname="net1")
    assert {"eth0", "net1"} <= set(pods[0].links())
    assert len(net.leases()) == 3
    assert len(os.listdir(os.path.join(net.cache_dir, "results"))) == 3

    net.must("gc", "clinet", pods[1].path)  # cnitool's gc: every cached attachment goes
    assert os.listdir(os.path.join(net.cache_dir, "results")) == []
    assert net.leases() == []
    for pod in pods:
        assert "eth0" not in pod.links()


def test_del_with_a_corrupt_cache_still_cleans_up(net, netns_factory):
    pod = netns_factory("pod")
    net.must("add", "clinet", pod.path)
    entry = cache_entry_path(net.cache_dir, "clinet", pod.path)
    with open(entry, "w") as fh:
        fh.write('{"kind": "cniCacheV1", "result": ')  # a crash mid-write
    net.must("del", "clinet", pod.path)
    assert not os.path.exists(entry)
    assert "eth0" not in pod.links() and net.leases() == []


def test_check_on_an_old_list_is_refused_readably(node, netns_factory, tmp_path):
    conf_dir = str(tmp_path / "net.d")
    write_network(conf_dir, bridge_hostlocal("oldnet", str(tmp_path / "ipam"), version="0.3.1"))
    runner = Runner("pycni", node, conf_dir, str(tmp_path / "cache"), REFERENCE_BIN)
    pod = netns_factory("pod")
    runner.must("add", "oldnet", pod.path)
    out = runner.run("check", "oldnet", pod.path)
    assert out.code == 1
    assert 'configuration version "0.3.1" does not support the CHECK command' in out.stderr
    runner.must("del", "oldnet", pod.path)


def test_plugin_failure_is_reported_with_plugin_and_code(node, netns_factory, tmp_path):
    conf_dir = str(tmp_path / "net.d")
    write_network(
        conf_dir, bridge_hostlocal("badnet", str(tmp_path / "ipam"), subnet="10.9.0.0/31")
    )
    runner = Runner("pycni", node, conf_dir, str(tmp_path / "cache"), REFERENCE_BIN)
    pod = netns_factory("pod")
    out = runner.run("add", "badnet", pod.path)
    assert out.code == 1 and out.stdout == ""
    assert 'plugin "bridge" failed (ADD)' in out.stderr and "CNI error" in out.stderr
    assert "too small" in out.stderr and "Traceback" not in out.stderr
    assert f"pycni net del badnet {pod.path}" in out.stderr
    assert not os.path.exists(cache_entry_path(runner.cache_dir, "badnet", pod.path))

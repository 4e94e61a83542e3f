"""pycni-svc through the executables, in one conflist after pycni-bridge and before the
reference portmap, against a real pycnid in a node namespace (`pycni net`: a libcni-style
runtime with its result cache). The endpoint records are read from pycnid's SQLite store.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from cni.runtime.tool import container_id_for
from services.record import EndpointRecord
from store.base import PREFIX, Put
from store.keys import ENDPOINTS
from store.sqlite import SqliteStore
from tests.fixtures.cnirun import (
    Runner,
    cache_entry_path,
    ipv4_only_tools_path,
    pod_ipv4,
    write_network,
)
from tests.fixtures.plugins import run_plugin

pytestmark = pytest.mark.netns
PORT_MAPPINGS = {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}
SVC_ARGS = {
    "cni": {
        "labels": [{"key": "app", "value": "web"}],
        "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}],
    }
}


def conflist(name: str, socket: str, subnet: str, bridge: str, svc: bool) -> dict:
    plugins = [
        {
            "type": "pycni-bridge",
            "bridge": bridge,
            "isGateway": True,
            "ipam": {
                "type": "pycni-ipam",
                "daemonSocket": socket,
                "ranges": [[{"subnet": subnet}]],
            },
        }
    ]
    if svc:
        plugins.append({"type": "pycni-svc", "args": SVC_ARGS})
    plugins.append({"type": "portmap", "capabilities": {"portMappings": True}})
    return {"cniVersion": "1.0.0", "name": name, "plugins": plugins}  # portmap: 1.0.0 at most


def pod_args(name: str) -> str:
    return f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}"


@pytest.fixture
def net(node, pycnid, tmp_path, cni_path):
    runner = Runner(
        "pycni",
        node,
        str(tmp_path / "net.d"),
        str(tmp_path / "cache"),
        cni_path,
        extra_env={
            "PYCNI_SOCKET": pycnid.socket,
            "PATH": ipv4_only_tools_path(str(tmp_path / "v4tools")),
        },
    )
    write_network(
        runner.conf_dir, conflist("svcnet", pycnid.socket, "10.81.0.0/24", "svcbr0", True)
    )
    write_network(
        runner.conf_dir, conflist("plainnet", pycnid.socket, "10.82.0.0/24", "plainbr0", False)
    )
    store = SqliteStore(pycnid.config["store"]["path"])
    runner.store = store
    yield runner
    store.close()


def endpoints(store) -> dict[str, EndpointRecord]:
    return {kv.key: EndpointRecord.from_bytes(kv.key, kv.value) for kv in store.range(ENDPOINTS)}


def add(net, pod, name: str, network: str = "svcnet") -> dict:
    return net.must("add", network, pod.path, cap_args=PORT_MAPPINGS, cni_args=pod_args(name)).json


def test_add_publishes_check_verifies_del_withdraws(net, netns_factory):
    pod = netns_factory("pod")
    result = add(net, pod, "web-0")
    assert any(i.get("sandbox") == pod.path for i in result["interfaces"])  # prevResult on
    record = endpoints(net.store)[f"{ENDPOINTS}default/web-0/eth0"]
    assert record.ips == (pod_ipv4(result),) and record.labels == {"app": "web"}
    assert record.ports == {"http": 80} and record.node == "node1"
    assert (record.container_id, record.network) == (container_id_for(pod.path), "svcnet")
    check = dict(cap_args=PORT_MAPPINGS, cni_args=pod_args("web-0"))
    net.must("check", "svcnet", pod.path, **check)

    changed = replace(record, labels={"app": "db"})
    net.store.txn([], [Put(record.key, changed.to_bytes())])
    broken = net.run("check", "svcnet", pod.path, **check)
    assert broken.code == 1 and "labels" in broken.stderr and "'app': 'db'" in broken.stderr
    assert "Traceback" not in broken.stderr

    net.must("del", "svcnet", pod.path, **check)
    assert endpoints(net.store) == {}
    net.must("del", "svcnet", pod.path, **check)  # a repeated DEL is fine


def test_del_with_the_netns_gone_and_no_prev_result(net, netns_factory):
    pod = netns_factory("pod")
    add(net, pod, "web-0")
    path = pod.path
    os.remove(cache_entry_path(net.cache_dir, "svcnet", path))  # no prevResult on DEL
    pod.delete()
    net.must("del", "svcnet", path, cni_args=pod_args("web-0"))
    assert endpoints(net.store) == {}


def test_del_of_an_old_sandbox_leaves_the_pod_that_reuses_its_name(net, netns_factory):
    old, new = netns_factory("pod"), netns_factory("pod")
    add(net, old, "web-0")
    add(net, new, "web-0")  # the Pod recreated: its record replaces the old one
    net.must("del", "svcnet", old.path, cni_args=pod_args("web-0"))
    (record,) = endpoints(net.store).values()
    assert record.container_id == container_id_for(new.path)


def test_gc_withdraws_this_nodes_invalid_attachments_only(net, netns_factory, cni_bin, pycnid):
    pods = [netns_factory("pod") for _ in range(2)]
    for i, pod in enumerate(pods):
        add(net, pod, f"web-{i}")
    other = EndpointRecord(
        "default", "far", "eth0", ("10.81.9.9",), {"app": "web"}, "node2", {}, "c-far", "svcnet"
    )
    net.store.txn([], [Put(other.key, other.to_bytes())])
    conf = {
        "cniVersion": "1.1.0",
        "name": "svcnet",
        "type": "pycni-svc",
        "cni.dev/valid-attachments": [
            {"containerID": container_id_for(pods[0].path), "ifname": "eth0"}
        ],
    }
    out = run_plugin(os.path.join(cni_bin, "pycni-svc"), "GC", conf, socket=pycnid.socket)
    assert out.code == 0, out.stdout + out.stderr
    assert sorted(r.pod for r in endpoints(net.store).values()) == ["far", "web-0"]


def store_contents(store) -> dict[str, bytes]:
    return {kv.key: kv.value for kv in store.range(PREFIX)}


def changed_kinds(before: dict, after: dict) -> set[str]:
    """The key kinds (``leases``, ``blocks``, ``endpoints`` ...) an operation changed."""
    keys = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    return {k[len(PREFIX) :].split("/")[0] for k in keys}


def test_a_network_without_pycni_svc_writes_no_endpoint(net, netns_factory):
    plain, served = netns_factory("pod"), netns_factory("pod")
    before = store_contents(net.store)
    add(net, plain, "web-0", network="plainnet")
    middle = store_contents(net.store)
    add(net, served, "web-1")
    after = store_contents(net.store)
    assert not any(k.startswith(ENDPOINTS) for k in middle)
    assert changed_kinds(middle, after) - changed_kinds(before, middle) == {"endpoints"}
    assert json.loads(after[f"{ENDPOINTS}default/web-1/eth0"])["network"] == "svcnet"
    net.must("del", "plainnet", plain.path, cni_args=pod_args("web-0"))
    assert endpoints(net.store).keys() == {f"{ENDPOINTS}default/web-1/eth0"}

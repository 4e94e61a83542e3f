"""pycni-svc under both runtimes ("go" = libcni 1.1.2 through the driver, "pycni" = `pycni net`),
chained after a main plugin and before the reference portmap, against a real pycnid whose
SQLite store the tests read.

The main plugin is pycni-bridge + pycni-ipam or the reference bridge + host-local: pycni-svc
reads the Pod's addresses from whichever prevResult it is given. Labels travel as CNI_ARGS
``PYCNI_LABELS`` because the Go runtime has no way to pass ``args.cni`` (libcni 1.1.2's
RuntimeConf carries CNI_ARGS and capability args only, and the driver passes just those).
``IgnoreUnknown=1`` is in CNI_ARGS as containerd sends it: the reference bridge and host-local
refuse unknown CNI_ARGS keys without it. GC is driven through pycni's runtime only (lists of
1.1.0; libcni 1.1.2 has no GC) and without portmap (the reference plugins stop at 1.0.0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cni.runtime.tool import container_id_for
from services.record import EndpointRecord, endpoint_key
from store.keys import ENDPOINTS, handles_prefix
from store.sqlite import SqliteStore
from tests.fixtures.cnirun import (
    REPO,
    assert_host_port_reaches,
    cache_entry_path,
    ipv4_only_tools_path,
    link_client,
    pod_ipv4,
    write_network,
)

from .test_libcni_interop import (
    HOST_PORT,
    PORT_MAPPINGS,
    RUNTIMES,
    daemon_socket,
    main_conf,
    modules_for,
)

pytestmark = [pytest.mark.interop, pytest.mark.netns]

SUBNET, NETWORK = "10.74.0.0/24", "svcnet"
LABELS = {"app": "web", "tier": "front"}
MAINS = ["pycni-bridge", "bridge"]


def pod_args(name: str = "web-0") -> str:
    return (
        f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name};"
        "PYCNI_LABELS=app:web,tier:front"
    )


def svc_conflist(
    main: str, tmp_path, socket: str, version: str = "1.0.0", portmap: bool = True
) -> dict:
    plugins = [
        main_conf(main, SUBNET, tmp_path, socket),
        {"type": "pycni-svc", "daemonSocket": socket},
    ]
    if portmap:
        plugins.append({"type": "portmap", "capabilities": {"portMappings": True}})
    return {"cniVersion": version, "name": NETWORK, "plugins": plugins}


@pytest.fixture
def svc_net(request, make_runner, tmp_path):
    """setup(runtime, main, **conflist) -> (runner, store): pycnid serving pycni-svc (and the
    pycni main plugin when asked for), the network written, its store open for reading."""
    opened: list[SqliteStore] = []

    def setup(runtime: str, main: str, **conflist):
        socket = daemon_socket(request, *modules_for(main, "pycni-svc"))
        runner = make_runner(runtime)
        runner.extra_env["PATH"] = ipv4_only_tools_path(str(tmp_path / "v4tools"))
        write_network(runner.conf_dir, svc_conflist(main, tmp_path, socket, **conflist))
        opened.append(SqliteStore(request.getfixturevalue("pycnid").config["store"]["path"]))
        return runner, opened[-1]

    yield setup
    for store in opened:
        store.close()


def endpoints(store) -> dict[str, EndpointRecord]:
    return {kv.key: EndpointRecord.from_bytes(kv.key, kv.value) for kv in store.range(ENDPOINTS)}


def add(runner, pod, name: str = "web-0") -> str:
    """ADD with the hostPort and the Pod's CNI_ARGS; the Pod's IPv4 address."""
    result = runner.must(
        "add", NETWORK, pod.path, cap_args=PORT_MAPPINGS, cni_args=pod_args(name)
    ).json
    assert any(i.get("sandbox") == pod.path for i in result["interfaces"])  # prevResult passed on
    return pod_ipv4(result)


def assert_added(main: str, store, node, tmp_path, pod, pod_ip: str) -> None:
    """After ADD: the endpoint record, portmap's rules and the address all there (the
    control for what DEL must remove)."""
    assert_published(store, pod, pod_ip)
    assert portmap_rules(node) and address_held(main, store, tmp_path, pod_ip)


def assert_published(store, pod, pod_ip: str, name: str = "web-0") -> None:
    record = endpoints(store)[endpoint_key("default", name, "eth0")]
    assert record.ips == (pod_ip,) and record.labels == LABELS and record.node == "node1"
    assert (record.namespace, record.pod) == ("default", name)
    assert (record.container_id, record.network) == (container_id_for(pod.path), NETWORK)


def address_held(main: str, store, tmp_path, pod_ip: str) -> bool:
    """Whether the IPAM still holds an address for this network (host-local: this one)."""
    if main == "bridge":
        return os.path.exists(tmp_path / "ipam" / NETWORK / pod_ip)
    return bool(list(store.range(handles_prefix(NETWORK))))


def portmap_rules(node) -> bool:
    return "CNI-DN-" in node.run(["iptables-save", "-t", "nat"]).stdout


def assert_all_gone(main: str, runner, store, node, tmp_path, pod_ip: str) -> None:
    assert endpoints(store) == {}, "the endpoint outlived DEL"
    assert not portmap_rules(node), "portmap's DNAT rules outlived DEL"
    assert not address_held(main, store, tmp_path, pod_ip), "the address outlived DEL"
    assert os.listdir(os.path.join(runner.cache_dir, "results")) == []


@pytest.mark.parametrize("main", MAINS)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_svc_publishes_the_pod_and_the_host_port_reaches_it(
    runtime, main, svc_net, node, netns_factory, tmp_path
):
    runner, store = svc_net(runtime, main)
    pod, client = netns_factory("pod"), netns_factory("client")
    node_ip = link_client(node, client)

    pod_ip = add(runner, pod)
    assert pod_ip.startswith("10.74.0.")
    assert_added(main, store, node, tmp_path, pod, pod_ip)
    assert_host_port_reaches(pod, client, f"http://{node_ip}:{HOST_PORT}", tmp_path)

    again = dict(cap_args=PORT_MAPPINGS, cni_args=pod_args())
    runner.must("check", NETWORK, pod.path, **again)
    runner.must("del", NETWORK, pod.path, **again)
    assert "eth0" not in pod.links()
    assert_all_gone(main, runner, store, node, tmp_path, pod_ip)


@pytest.mark.parametrize("cached", [True, False], ids=["prevResult", "no-prevResult"])
@pytest.mark.parametrize("main", MAINS)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_del_with_the_netns_gone(runtime, main, cached, svc_net, node, netns_factory, tmp_path):
    runner, store = svc_net(runtime, main)
    pod = netns_factory("pod")
    pod_ip, path = add(runner, pod), pod.path
    assert_added(main, store, node, tmp_path, pod, pod_ip)
    if not cached:
        os.remove(cache_entry_path(runner.cache_dir, NETWORK, path))
    pod.delete()

    runner.must("del", NETWORK, path, cap_args=PORT_MAPPINGS, cni_args=pod_args())
    assert_all_gone(main, runner, store, node, tmp_path, pod_ip)
    runner.must("del", NETWORK, path, cap_args=PORT_MAPPINGS, cni_args=pod_args())  # again: fine


GC_KEEPING = """
import json, sys
from cni.runtime.chain import Runtime
from cni.runtime.conflist import load_network_conf
conf_dir, cache_dir, path, network, valid = sys.argv[1:]
runtime = Runtime(path=tuple(path.split(":")), cache_dir=cache_dir)
attachments = [tuple(v) for v in json.loads(valid)]
runtime.gc_network_list(load_network_conf(conf_dir, network), attachments)
"""


def gc_keeping(runner, valid: list[tuple[str, str]]) -> None:
    """GC through pycni's runtime library with a valid-attachments list (`pycni net gc`, like
    cnitool's, always sends none), run in the node namespace like the runtimes."""
    cmd = [
        "ip",
        "netns",
        "exec",
        runner.node.name,
        sys.executable,
        "-c",
        GC_KEEPING,
        runner.conf_dir,
        runner.cache_dir,
        runner.cni_path,
        NETWORK,
        json.dumps(valid),
    ]
    proc = subprocess.run(
        cmd, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


def test_gc_withdraws_the_endpoints_of_attachments_not_valid(svc_net, netns_factory):
    """A withdrawn Pod's cache entry is removed first, so the runtime's own DEL of cached
    stale attachments cannot be what withdraws its endpoint: pycni-svc's GC must."""
    runner, store = svc_net("pycni", "pycni-bridge", version="1.1.0", portmap=False)
    gone, kept = netns_factory("pod"), netns_factory("pod")
    for pod, name in ((gone, "web-0"), (kept, "web-1")):
        runner.must("add", NETWORK, pod.path, cni_args=pod_args(name))
    os.remove(cache_entry_path(runner.cache_dir, NETWORK, gone.path))

    gc_keeping(runner, [(container_id_for(kept.path), "eth0")])
    assert [r.pod for r in endpoints(store).values()] == ["web-1"]
    assert len(list(store.range(handles_prefix(NETWORK)))) == 1  # gone's address released
    runner.must("check", NETWORK, kept.path, cni_args=pod_args("web-1"))  # kept: untouched

    os.remove(cache_entry_path(runner.cache_dir, NETWORK, kept.path))
    runner.must("gc", NETWORK, kept.path)  # `pycni net gc`: no attachment is valid
    assert endpoints(store) == {}
    assert list(store.range(handles_prefix(NETWORK))) == []

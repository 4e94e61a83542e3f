"""pycni's plugins under the reference runtime library, and pycni's runtime against it.

Every case runs with two runtimes: "go" = libcni 1.1.2 (Debian) through a small driver, and
"pycni" = `pycni net`; both inside the node namespace. The reference-plugin variants are the
control: they show the harness (namespaces, hostPort path, cache sharing) works on its own.
Debian's libcni 1.1.2 predates GC and STATUS and implements spec ≤ 1.0.0, so lists the Go
runtime drives are 1.0.0 and GC/STATUS are exercised through `pycni net` only.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.fixtures.cnirun import (
    assert_host_port_reaches,
    cache_entry_path,
    fetch,
    ipv4_only_tools_path,
    link_client,
    pod_ipv4,
    write_network,
)

from .conftest import require_pycni_plugin

pytestmark = [pytest.mark.interop, pytest.mark.netns]

RUNTIMES = ["go", "pycni"]
HOST_PORT, POD_PORT = 8080, 80
PORT_MAPPINGS = {
    "portMappings": [{"hostPort": HOST_PORT, "containerPort": POD_PORT, "protocol": "tcp"}]
}


def ipam_conf(kind: str, subnet: str, tmp_path, socket: str) -> dict:
    if kind == "host-local":
        return {
            "type": "host-local",
            "dataDir": str(tmp_path / "ipam"),
            "ranges": [[{"subnet": subnet}]],
        }
    return {"type": "pycni-ipam", "daemonSocket": socket, "ranges": [[{"subnet": subnet}]]}


def main_conf(kind: str, subnet: str, tmp_path, socket: str = "") -> dict:
    """The reference bridge with host-local, or pycni-bridge with pycni-ipam."""
    if kind == "bridge":
        return {
            "type": "bridge",
            "bridge": "iobr0",
            "isDefaultGateway": True,
            "ipam": ipam_conf("host-local", subnet, tmp_path, socket),
        }
    return {
        "type": "pycni-bridge",
        "bridge": "iobr0",
        "isDefaultGateway": True,
        "daemonSocket": socket,
        "ipam": ipam_conf("pycni-ipam", subnet, tmp_path, socket),
    }


def daemon_socket(request, *modules: str) -> str:
    """Start pycnid for the pycni plugins a case uses (skip when they have not landed)."""
    for module in modules:
        require_pycni_plugin(module)
    return request.getfixturevalue("pycnid").socket if modules else ""


def modules_for(*kinds: str) -> tuple[str, ...]:
    wanted = {
        "pycni-bridge": ("plugins.bridge.plugin", "plugins.ipam.plugin"),
        "pycni-ipam": ("plugins.ipam.plugin",),
        "pycni-svc": ("plugins.svc.plugin",),
    }
    return tuple(dict.fromkeys(m for k in kinds for m in wanted.get(k, ())))


@pytest.mark.parametrize("main", ["bridge", "pycni-bridge"])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_portmap_host_port_reaches_the_pod(
    runtime, main, request, make_runner, node, netns_factory, tmp_path
):
    socket = daemon_socket(request, *modules_for(main))
    runner = make_runner(runtime)
    runner.extra_env["PATH"] = ipv4_only_tools_path(str(tmp_path / "v4tools"))
    write_network(
        runner.conf_dir,
        {
            "cniVersion": "1.0.0",
            "name": "hpnet",
            "plugins": [
                main_conf(main, "10.79.0.0/24", tmp_path, socket),
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        },
    )
    pod, client = netns_factory("pod"), netns_factory("client")
    node_ip = link_client(node, client)

    result = runner.must("add", "hpnet", pod.path, cap_args=PORT_MAPPINGS).json
    pod_ip = pod_ipv4(result)
    assert pod_ip.startswith("10.79.0.")
    assert any(i.get("sandbox") == pod.path and i["name"] == "eth0" for i in result["interfaces"])
    assert_host_port_reaches(pod, client, f"http://{node_ip}:{HOST_PORT}", tmp_path)

    # As a runtime must, CHECK passes the same capability args as ADD (portmap checks its
    # DNAT rules for them; without them it checks nothing).
    runner.must("check", "hpnet", pod.path, cap_args=PORT_MAPPINGS)
    chain = next(
        line[1:].split()[0]
        for line in node.run(["iptables-save", "-t", "nat"]).stdout.splitlines()
        if line.startswith(":CNI-DN-")
    )
    node.run(["iptables", "-t", "nat", "-F", chain])  # lose the pod's DNAT rules
    broken = runner.run("check", "hpnet", pod.path, cap_args=PORT_MAPPINGS)
    assert broken.code == 1 and "dnat" in broken.stderr, broken.stderr

    runner.must("del", "hpnet", pod.path, cap_args=PORT_MAPPINGS)
    assert "eth0" not in pod.links()
    assert not os.path.exists(cache_entry_path(runner.cache_dir, "hpnet", pod.path))
    assert "CNI-DN-" not in node.run(["iptables-save", "-t", "nat"]).stdout
    assert fetch(client, f"http://{node_ip}:{HOST_PORT}/token", deadline=1) is None


@pytest.mark.parametrize("ipam", ["host-local", "pycni-ipam"])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_reference_bridge_with_ipam(runtime, ipam, request, make_runner, netns_factory, tmp_path):
    socket = daemon_socket(request, *modules_for(ipam))
    runner = make_runner(runtime)
    write_network(
        runner.conf_dir,
        {
            "cniVersion": "1.0.0",
            "name": "ipnet",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "iobr1",
                    "isDefaultGateway": True,
                    "ipam": ipam_conf(ipam, "10.78.0.0/24", tmp_path, socket),
                }
            ],
        },
    )
    pods = [netns_factory("pod") for _ in range(2)]
    addresses = []
    for pod in pods:
        result = runner.must("add", "ipnet", pod.path).json
        addresses.append(pod_ipv4(result))
        assert result["ips"][0]["gateway"] == "10.78.0.1"
        assert pod.ping("10.78.0.1"), f"{pod.name} cannot reach the gateway"
    assert len(set(addresses)) == 2 and all(a.startswith("10.78.0.") for a in addresses)
    assert pods[0].ping(addresses[1])

    for pod in pods:
        runner.must("check", "ipnet", pod.path)  # bridge CHECK delegates to the IPAM's CHECK
        runner.must("del", "ipnet", pod.path)
        assert "eth0" not in pod.links()
    assert os.listdir(os.path.join(runner.cache_dir, "results")) == []


@pytest.mark.parametrize("plugins", ["reference", "pycni"])
@pytest.mark.parametrize("adder,other", [("go", "pycni"), ("pycni", "go")])
def test_cache_is_shared_between_runtimes(
    adder, other, plugins, request, make_runner, netns_factory, tmp_path
):
    """ADD with one runtime; the other reads its cache entry (CHECK needs the prevResult),
    then DELs with it and removes the entry."""
    main = "bridge" if plugins == "reference" else "pycni-bridge"
    socket = daemon_socket(request, *modules_for(main))
    first, second = make_runner(adder), make_runner(other)
    write_network(
        first.conf_dir,
        {
            "cniVersion": "1.0.0",
            "name": "shnet",
            "plugins": [main_conf(main, "10.76.0.0/24", tmp_path, socket)],
        },
    )
    pod = netns_factory("pod")
    added = first.must("add", "shnet", pod.path, cni_args="IgnoreUnknown=1;K8S_POD_NAME=web").json
    entry = cache_entry_path(first.cache_dir, "shnet", pod.path)
    with open(entry, "rb") as fh:
        cached = json.load(fh)
    assert cached["kind"] == "cniCacheV1" and cached["result"]["ips"] == added["ips"]
    assert cached["cniArgs"] == [["IgnoreUnknown", "1"], ["K8S_POD_NAME", "web"]]

    if other == "go":
        seen = second.must("cached", "shnet", pod.path).json
        assert seen["ips"] == added["ips"] and seen["interfaces"] == added["interfaces"]
    second.must("check", "shnet", pod.path)
    second.must("del", "shnet", pod.path)
    assert not os.path.exists(entry)
    assert "eth0" not in pod.links()


def test_pycni_list_status_and_gc_with_pycni_net(
    request, make_runner, node, netns_factory, tmp_path
):
    """A 1.1.0 list of our plugins: STATUS and GC (which libcni 1.1.2 cannot send)."""
    socket = daemon_socket(request, *modules_for("pycni-bridge"))
    runner = make_runner("pycni")
    write_network(
        runner.conf_dir,
        {
            "cniVersion": "1.1.0",
            "name": "gcnet",
            "plugins": [main_conf("pycni-bridge", "10.75.0.0/24", tmp_path, socket)],
        },
    )
    pods = [netns_factory("pod") for _ in range(2)]
    for pod in pods:
        runner.must("add", "gcnet", pod.path)
    runner.must("status", "gcnet", pods[0].path)
    runner.must("gc", "gcnet", pods[0].path)
    assert os.listdir(os.path.join(runner.cache_dir, "results")) == []
    for pod in pods:
        assert "eth0" not in pod.links()
    assert node.run(["ip", "-o", "link", "show", "master", "iobr0"]).stdout.strip() == ""

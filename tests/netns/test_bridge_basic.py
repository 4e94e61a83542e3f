"""pycni-bridge in real namespaces: datapath, every spec version, and the config options."""

from __future__ import annotations

import pytest

from tests.fixtures.bridge import (
    GATEWAY,
    VERSIONS,
    bridge_conf,
    container_links,
    host_local_ipam,
    ip_of,
    masq_elements,
    new_cid,
    node_veths,
    pycni_ipam,
)

pytestmark = pytest.mark.netns


def test_two_pods_reach_each_other_and_the_gateway(bridge_node, netns_factory):
    conf = bridge_conf(pycni_ipam())
    pod_a, pod_b = netns_factory("pod"), netns_factory("pod")
    _, res_a = bridge_node.add(conf, pod_a)
    _, res_b = bridge_node.add(conf, pod_b)
    assert ip_of(res_a) != ip_of(res_b)
    assert pod_a.ping(GATEWAY) and pod_b.ping(GATEWAY)
    assert pod_a.ping(ip_of(res_b)) and pod_b.ping(ip_of(res_a))
    assert bridge_node.node.ping(ip_of(res_a))


def test_masquerade_elements_name_the_attachment(bridge_node, netns_factory):
    pod = netns_factory("pod")
    cid, res = bridge_node.add(bridge_conf(pycni_ipam()), pod)
    elements = masq_elements(bridge_node.node)
    assert len(elements) == 2
    assert all(f"podnet/{cid}/eth0" in e and ip_of(res) in e for e in elements)


def check_shape(result: dict, version: str, netns: str) -> None:
    assert result["cniVersion"] == version
    bridge, host, container = result["interfaces"]
    assert bridge["name"] == "pycni0" and host["name"].startswith("veth")
    assert container == {"name": "eth0", "mac": container["mac"], "sandbox": netns}
    ip = result["ips"][0]
    assert ip["interface"] == 2 and ip["gateway"] == GATEWAY
    if version in ("0.3.0", "0.3.1", "0.4.0"):
        assert ip["version"] == "4"
    else:
        assert "version" not in ip
    assert result["routes"] == [{"dst": "0.0.0.0/0"}]


@pytest.mark.parametrize("version", VERSIONS)
def test_add_check_del_in_every_version(bridge_node, netns_factory, version):
    pod = netns_factory("pod")
    conf = bridge_conf(pycni_ipam(), version=version)
    cid, result = bridge_node.add(conf, pod)
    check_shape(result, version, pod.path)
    links = container_links(pod)
    assert links["eth0"]["address"] == result["interfaces"][2]["mac"]
    if version >= "0.4.0":
        check = bridge_node.run("CHECK", {**conf, "prevResult": result}, cid, pod.path)
        assert check.code == 0, check.stdout
    gone = bridge_node.run("DEL", {**conf, "prevResult": result}, cid, pod.path)
    assert gone.code == 0 and gone.stdout == ""
    assert "eth0" not in container_links(pod)
    assert bridge_node.residue().is_empty()


def test_mtu_on_both_ends_and_on_a_new_bridge(bridge_node, netns_factory):
    pod = netns_factory("pod")
    _, result = bridge_node.add(bridge_conf(pycni_ipam(), mtu=1400), pod)
    host = result["interfaces"][1]["name"]
    node_links = container_links(bridge_node.node)
    assert node_links[host]["mtu"] == 1400 and node_links["pycni0"]["mtu"] == 1400
    assert container_links(pod)["eth0"]["mtu"] == 1400
    assert result["interfaces"][2]["mtu"] == 1400


def test_hairpin_mode_sets_the_port_flag(bridge_node, netns_factory):
    pod = netns_factory("pod")
    _, result = bridge_node.add(bridge_conf(pycni_ipam(), hairpinMode=True), pod)
    host = result["interfaces"][1]["name"]
    port = bridge_node.node.run(["ip", "-d", "link", "show", host]).stdout
    assert "hairpin on" in port


def test_promisc_mode_sets_the_bridge_promiscuous(bridge_node, netns_factory):
    pod = netns_factory("pod")
    bridge_node.add(bridge_conf(pycni_ipam(), promiscMode=True), pod)
    assert "PROMISC" in bridge_node.node.run(["ip", "link", "show", "pycni0"]).stdout


def test_hairpin_and_promisc_together_are_invalid(bridge_node, netns_factory):
    pod = netns_factory("pod")
    res = bridge_node.run(
        "ADD", bridge_conf(pycni_ipam(), promiscMode=True, hairpinMode=True), new_cid(), pod.path
    )
    assert res.code != 0 and res.error_code() == 7
    assert "hairpinMode" in res.json["msg"]
    assert bridge_node.residue().is_empty()


def test_other_gateway_address_needs_force_address(bridge_node, netns_factory):
    node = bridge_node.node
    node.run("ip link add pycni0 type bridge && ip addr add 10.99.0.1/24 dev pycni0")
    pod = netns_factory("pod")
    res = bridge_node.run("ADD", bridge_conf(pycni_ipam()), new_cid(), pod.path)
    assert res.error_code() == 7 and "10.99.0.1/24" in res.json["msg"]
    assert "forceAddress" in res.json["details"]
    assert bridge_node.residue().is_empty()
    bridge_node.add(bridge_conf(pycni_ipam(), forceAddress=True), pod)
    addrs = node.run(["ip", "-4", "-o", "addr", "show", "pycni0"]).stdout
    assert f"{GATEWAY}/24" in addrs and "10.99.0.1" not in addrs


def test_add_on_an_existing_ifname_fails_and_leaks_nothing(bridge_node, netns_factory):
    pod = netns_factory("pod")
    pod.run("ip link add eth0 type veth peer name spare0")
    baseline = node_veths(bridge_node.node)
    res = bridge_node.run("ADD", bridge_conf(pycni_ipam()), new_cid(), pod.path)
    assert res.code != 0 and "eth0 already exists" in res.json["msg"]
    assert node_veths(bridge_node.node) == baseline
    assert bridge_node.residue().is_empty()


def test_repeated_add_without_del_is_refused_and_keeps_the_first(bridge_node, netns_factory):
    pod, other = netns_factory("pod"), netns_factory("pod")
    conf = bridge_conf(pycni_ipam())
    cid, first = bridge_node.add(conf, pod)
    again = bridge_node.run("ADD", conf, cid, other.path)
    assert again.code != 0 and "already exists" in again.json["msg"]
    assert pod.ping(GATEWAY)
    check = bridge_node.run("CHECK", {**conf, "prevResult": first}, cid, pod.path)
    assert check.code == 0, check.stdout


def test_config_dns_and_mac_are_honoured(bridge_node, netns_factory):
    pod = netns_factory("pod")
    conf = bridge_conf(
        pycni_ipam(),
        dns={"nameservers": ["10.22.0.53"], "search": ["svc"]},
        runtimeConfig={"mac": "02:AA:BB:CC:DD:EE"},
    )
    _, result = bridge_node.add(conf, pod, args="IgnoreUnknown=1;MAC=02:00:00:00:00:01")
    assert result["dns"] == {"nameservers": ["10.22.0.53"], "search": ["svc"]}
    assert result["interfaces"][2]["mac"] == "02:aa:bb:cc:dd:ee"
    assert container_links(pod)["eth0"]["address"] == "02:aa:bb:cc:dd:ee"


def test_is_default_gateway_adds_the_default_route(bridge_node, netns_factory):
    pod = netns_factory("pod")
    ipam = {**pycni_ipam(), "routes": []}
    _, result = bridge_node.add(bridge_conf(ipam, isDefaultGateway=True), pod)
    assert result["routes"] == [{"dst": "0.0.0.0/0", "gw": GATEWAY}]
    assert f"default via {GATEWAY}" in pod.run("ip route").stdout


def test_host_local_delegation(bridge_node, netns_factory):
    pod = netns_factory("pod")
    conf = bridge_conf(
        host_local_ipam(bridge_node.host_local_dir), version="1.0.0"
    )  # Debian host-local: <= 1.0.0
    cid, result = bridge_node.add(conf, pod)
    assert result["ips"][0]["address"] == "10.22.0.2/24"
    assert bridge_node.residue().leases == ["10.22.0.2"]
    assert pod.ping(GATEWAY)
    check = bridge_node.run("CHECK", {**conf, "prevResult": result}, cid, pod.path)
    assert check.code == 0, check.stdout
    assert bridge_node.run("DEL", conf, cid, pod.path).code == 0
    assert bridge_node.residue().is_empty()


def test_next_add_heals_a_removed_gateway_and_a_deleted_bridge(bridge_node, netns_factory):
    conf = bridge_conf(pycni_ipam())
    node = bridge_node.node
    bridge_node.add(conf, netns_factory("pod"))
    node.run(f"ip addr del {GATEWAY}/24 dev pycni0")
    _, healed = bridge_node.add(conf, netns_factory("pod"))
    assert f"{GATEWAY}/24" in node.run("ip -4 -o addr show pycni0").stdout
    node.run("ip link del pycni0")
    pod = netns_factory("pod")
    _, recreated = bridge_node.add(conf, pod)
    assert recreated["interfaces"][0]["mac"] != healed["interfaces"][0]["mac"]
    assert pod.ping(GATEWAY)


def test_the_node_netns_is_not_a_pod(bridge_node):
    res = bridge_node.run("ADD", bridge_conf(pycni_ipam()), new_cid(), bridge_node.node.path)
    assert res.error_code() == 4 and "node's own" in res.json["msg"]
    assert bridge_node.residue().is_empty()
    assert "eth0" not in container_links(bridge_node.node)

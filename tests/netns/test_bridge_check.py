"""pycni-bridge CHECK names what differs from prevResult, so an
operator reading the runtime's error knows what to repair."""

from __future__ import annotations

import pytest

from tests.fixtures.bridge import bridge_conf, ip_of, pycni_ipam

pytestmark = pytest.mark.netns


@pytest.fixture
def added(bridge_node, netns_factory):
    """(conf with prevResult, containerID, pod, host veth) of one ADDed pod."""
    pod = netns_factory("pod")
    conf = bridge_conf(pycni_ipam(), hairpinMode=True)
    cid, result = bridge_node.add(conf, pod)
    check = bridge_node.run("CHECK", {**conf, "prevResult": result}, cid, pod.path)
    assert check.code == 0, check.stdout
    return {**conf, "prevResult": result}, cid, pod, result["interfaces"][1]["name"]


def failed_check(bridge_node, added) -> str:
    conf, cid, pod, _ = added
    res = bridge_node.run("CHECK", conf, cid, pod.path)
    assert res.code != 0 and res.error_code() == 100, res.stdout
    return res.json["msg"]


def test_deleted_address(bridge_node, added):
    conf, _, pod, _ = added
    address = conf["prevResult"]["ips"][0]["address"]
    pod.run(f"ip addr del {address} dev eth0")
    assert failed_check(bridge_node, added) == f"address {address} is missing from eth0"


def test_deleted_route(bridge_node, added):
    _, _, pod, _ = added
    pod.run("ip route del default")
    assert failed_check(bridge_node, added) == (
        "route 0.0.0.0/0 via 10.22.0.1 dev eth0 is missing in the pod"
    )


def test_deleted_host_veth(bridge_node, added):
    _, _, pod, host = added
    bridge_node.node.run(f"ip link del {host}")
    assert "container interface eth0 is missing" in failed_check(bridge_node, added)


def test_renamed_host_veth(bridge_node, added):
    _, _, _, host = added
    bridge_node.node.run(f"ip link set {host} name stray0")
    assert failed_check(bridge_node, added) == f"host veth {host} of eth0 is missing from the node"


def test_host_veth_off_the_bridge(bridge_node, added):
    _, _, _, host = added
    bridge_node.node.run(f"ip link set {host} nomaster")
    assert failed_check(bridge_node, added) == f"host veth {host} is not a port of bridge pycni0"


def test_hairpin_turned_off(bridge_node, added):
    _, _, _, host = added
    bridge_node.node.run(f"ip link set {host} type bridge_slave hairpin off")
    assert "hairpin" in failed_check(bridge_node, added)


def test_deleted_masquerade_element(bridge_node, added):
    conf, cid, _, _ = added
    ip = ip_of(conf["prevResult"])
    bridge_node.node.run(f"nft delete element inet pycni-masq masq4 '{{ \"pycni0\" . {ip} }}'")
    msg = failed_check(bridge_node, added)
    assert msg == (
        f'masquerade element "pycni0" . {ip} of podnet/{cid}/eth0 is missing from '
        "set masq4 of table inet pycni-masq"
    )


def test_released_lease(bridge_node, added):
    conf, cid, pod, _ = added
    ipam_only = {**conf, "type": "pycni-ipam"}
    ipam_exe = bridge_node.exe.replace("pycni-bridge", "pycni-ipam")
    from tests.fixtures.plugins import run_plugin

    released = run_plugin(
        ipam_exe,
        "DEL",
        ipam_only,
        container_id=cid,
        netns=pod.path,
        cni_path=bridge_node.cni_path,
        socket=bridge_node.socket,
    )
    assert released.code == 0, released.stdout
    assert "lease" in failed_check(bridge_node, added)


def test_check_needs_prev_result(bridge_node, added):
    conf, cid, pod, _ = added
    res = bridge_node.run(
        "CHECK", {k: v for k, v in conf.items() if k != "prevResult"}, cid, pod.path
    )
    assert res.error_code() == 7 and "prevResult" in res.json["msg"]


def test_check_with_a_garbage_prev_result(bridge_node, added):
    conf, cid, pod, _ = added
    res = bridge_node.run("CHECK", {**conf, "prevResult": ["garbage"]}, cid, pod.path)
    assert res.code != 0 and res.error_code() == 6

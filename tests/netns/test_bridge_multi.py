"""Attachments that share something: the same subnet on two networks (masquerading belongs to
each attachment, keyed by its bridge) and one Pod on two networks (each attachment's routes on
its own device, CHECK per device)."""

from __future__ import annotations

import json
import os
import socket

import pytest

from kernel.ns import entered
from tests.fixtures.bridge import (
    bridge_conf,
    ip_of,
    masq_elements,  # noqa: F401
    pycni_ipam,
)
from tests.fixtures.doctor import run_doctor

pytestmark = pytest.mark.netns
UPLINK_NODE, UPLINK_OUTSIDE = "192.168.77.1", "192.168.77.2"


@pytest.fixture
def outside(bridge_node, netns_factory):
    """A namespace beyond the node with a UDP socket listening; it has no route back to the
    pod subnets, so whatever arrives from 10.22.0.0/24 unmasqueraded shows its pod address."""
    ns = netns_factory("outside")
    node = bridge_node.node
    node.run(f"ip link add up0 type veth peer name down0 netns {ns.name}")
    node.run(f"ip addr add {UPLINK_NODE}/24 dev up0 && ip link set up0 up")
    ns.run(f"ip addr add {UPLINK_OUTSIDE}/24 dev down0 && ip link set down0 up")
    listener = socket_in(ns, socket.SOCK_DGRAM)
    listener.bind((UPLINK_OUTSIDE, 0))
    listener.settimeout(10)  # a bound on a datagram that never comes, not a measurement
    yield listener
    listener.close()


def socket_in(ns, kind: int) -> socket.socket:
    """A socket of namespace ``ns`` (a socket stays in the netns it was made in)."""
    fd = os.open(ns.path, os.O_RDONLY)
    try:
        with entered(fd):
            return socket.socket(socket.AF_INET, kind)
    finally:
        os.close(fd)


def source_seen_outside(pod, listener: socket.socket) -> str:
    """Send one datagram from ``pod`` (a fresh socket: a new conntrack entry, so the NAT
    rules are consulted again) and return the source address it arrived with."""
    payload = os.urandom(8)
    with socket_in(pod, socket.SOCK_DGRAM) as sender:
        sender.sendto(payload, listener.getsockname())
    while True:
        data, (source, _) = listener.recvfrom(64)
        if data == payload:
            return source


def check(bridge_node, conf: dict, result: dict, cid: str, pod, ifname: str = "eth0"):
    return bridge_node.run("CHECK", {**conf, "prevResult": result}, cid, pod.path, ifname=ifname)


def test_same_subnet_on_two_bridges_keeps_both_masqueraded(bridge_node, netns_factory, outside):
    conf_a = bridge_conf(pycni_ipam(), name="neta", bridge="pycni0")
    conf_b = bridge_conf(pycni_ipam(), name="netb", bridge="pycni1")
    pod_a, pod_b = netns_factory("pod"), netns_factory("pod")
    baseline = bridge_node.residue("netb")  # the uplink veth, unlabelled
    cid_a, res_a = bridge_node.add(conf_a, pod_a)
    cid_b, res_b = bridge_node.add(conf_b, pod_b)
    assert ip_of(res_a) == ip_of(res_b)  # the premise: one address, two networks
    for conf, res, cid, pod in ((conf_a, res_a, cid_a, pod_a), (conf_b, res_b, cid_b, pod_b)):
        assert check(bridge_node, conf, res, cid, pod).code == 0, cid
        assert source_seen_outside(pod, outside) == UPLINK_NODE
    assert bridge_node.run("DEL", conf_b, cid_b, pod_b.path).code == 0
    assert bridge_node.residue("netb") == baseline
    assert check(bridge_node, conf_a, res_a, cid_a, pod_a).code == 0
    assert source_seen_outside(pod_a, outside) == UPLINK_NODE


def test_same_address_on_one_bridge_is_refused_and_leaves_nothing(
    bridge_node, netns_factory, outside
):
    conf_a = bridge_conf(pycni_ipam(), name="neta")
    conf_c = bridge_conf(pycni_ipam(), name="netc")  # same ranges, same bridge pycni0
    pod_a, pod_c = netns_factory("pod"), netns_factory("pod")
    baseline = bridge_node.residue("netc")  # the uplink veth, unlabelled
    cid_a, res_a = bridge_node.add(conf_a, pod_a)
    refused = bridge_node.run("ADD", conf_c, "c-conflict", pod_c.path)
    assert refused.error_code() == 102, refused.stdout
    assert refused.json["msg"] == (
        f"address {ip_of(res_a)} on bridge pycni0 is already used by attachment neta/{cid_a}/eth0"
    )
    assert bridge_node.residue("netc") == baseline
    assert pod_c.links() == ["lo"]
    assert check(bridge_node, conf_a, res_a, cid_a, pod_a).code == 0
    assert source_seen_outside(pod_a, outside) == UPLINK_NODE


LEGACY_TABLE = """\
add table inet pycni-masq { comment "pycni-bridge ipMasq"; }
add chain inet pycni-masq postrouting { type nat hook postrouting priority srcnat; policy accept; }
add set inet pycni-masq masq4 { type ipv4_addr; }
add set inet pycni-masq nomasq4 { type ipv4_addr . ipv4_addr; flags interval; }
add set inet pycni-masq masq6 { type ipv6_addr; }
add set inet pycni-masq nomasq6 { type ipv6_addr . ipv6_addr; flags interval; }
add rule inet pycni-masq postrouting ip saddr . ip daddr @nomasq4 return
add rule inet pycni-masq postrouting ip saddr @masq4 ip daddr != 224.0.0.0/4 masquerade
add element inet pycni-masq masq4 { IP comment "TAG" }
add element inet pycni-masq nomasq4 { IP . 10.22.0.0/24 comment "TAG" }
add element inet pycni-masq masq4 { 10.22.0.77 comment "neta/gone/eth0" }
"""


def test_a_node_with_the_address_keyed_table_keeps_working(
    bridge_node, pycnid, netns_factory, outside
):
    """pycnid upgraded on a node whose table has the address-keyed layout: the next ADD
    succeeds, live Pods' elements are rekeyed by their bridge (CHECK passes, still
    masqueraded) and a gone attachment's element is dropped; `pycni doctor` reports the old
    layout meanwhile."""
    conf_a = bridge_conf(pycni_ipam(), name="neta")
    pod_a, pod_b = netns_factory("pod"), netns_factory("pod")
    cid_a, res_a = bridge_node.add(conf_a, pod_a)
    pycnid.stop()
    node = bridge_node.node
    node.run("nft delete table inet pycni-masq")
    legacy = LEGACY_TABLE.replace("IP", ip_of(res_a)).replace("TAG", f"neta/{cid_a}/eth0")
    node.run(["nft", "-f", "-"], input=legacy)
    code, doc = run_doctor(node, os.path.join(pycnid.workdir, "pycnid.json"), networks=("neta",))
    assert (code, [f["kind"] for f in doc["findings"]]) == (2, ["masq-layout"]), doc
    pycnid.start()
    bridge_node.add(bridge_conf(pycni_ipam(), name="netb", bridge="pycni1"), pod_b)
    sets = {
        item["set"]["name"]: item["set"]["type"]
        for item in json.loads(node.run("nft -j list table inet pycni-masq").stdout)["nftables"]
        if "set" in item
    }
    assert sets["masq4"] == ["ifname", "ipv4_addr"]
    assert not [e for e in masq_elements(node, "neta") if "gone" in e]
    assert check(bridge_node, conf_a, res_a, cid_a, pod_a).code == 0
    assert source_seen_outside(pod_a, outside) == UPLINK_NODE
    assert source_seen_outside(pod_b, outside) == UPLINK_NODE


DUAL = {"a": ("10.22.0.0/24", "fd22::/64"), "b": ("10.23.0.0/24", "fd23::/64")}


def dual_stack(name: str) -> dict:
    v4, v6 = DUAL[name]
    ipam = {
        "type": "pycni-ipam",
        "ranges": [[{"subnet": v4}], [{"subnet": v6}]],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
    }
    return bridge_conf(ipam, name=f"net{name}", bridge=f"pycni-{name}")


def default_routes(pod, version: int) -> set[tuple[str, str]]:
    """(gateway, device) of each default route (each nexthop of a multipath one)."""
    routes = json.loads(pod.run(["ip", f"-{version}", "-j", "route", "show", "default"]).stdout)
    hops = [hop for r in routes for hop in r.get("nexthops", [r])]
    return {(hop["gateway"], hop["dev"]) for hop in hops}


def test_one_pod_on_two_networks_has_both_default_routes(bridge_node, netns_factory):
    pod = netns_factory("pod")
    conf_a, conf_b = dual_stack("a"), dual_stack("b")
    cid, res_a = bridge_node.add(conf_a, pod)
    _, res_b = bridge_node.add(conf_b, pod, container_id=cid, ifname="net1")
    assert default_routes(pod, 4) == {("10.22.0.1", "eth0"), ("10.23.0.1", "net1")}
    assert default_routes(pod, 6) == {("fd22::1", "eth0"), ("fd23::1", "net1")}
    assert check(bridge_node, conf_a, res_a, cid, pod).code == 0
    res = check(bridge_node, conf_b, res_b, cid, pod, ifname="net1")
    assert res.code == 0, res.stdout
    assert bridge_node.run("DEL", conf_b, cid, pod.path, ifname="net1").code == 0
    assert default_routes(pod, 4) == {("10.22.0.1", "eth0")}
    assert default_routes(pod, 6) == {("fd22::1", "eth0")}
    assert check(bridge_node, conf_a, res_a, cid, pod).code == 0


def test_check_does_not_pass_on_a_route_of_another_device(bridge_node, netns_factory):
    pod = netns_factory("pod")
    conf_a, conf_b = dual_stack("a"), dual_stack("b")
    cid, _ = bridge_node.add(conf_a, pod)
    _, res_b = bridge_node.add(conf_b, pod, container_id=cid, ifname="net1")
    pod.run("ip route del default via 10.23.0.1 dev net1")
    pod.run("ip route append default via 10.23.0.1 dev eth0 onlink")  # same dst and gw
    res = check(bridge_node, conf_b, res_b, cid, pod, ifname="net1")
    assert res.error_code() == 100, res.stdout
    assert res.json["msg"] == "route 0.0.0.0/0 via 10.23.0.1 dev net1 is missing in the pod"

"""pycni-bridge datapath beyond the bridge: masquerade to the outside, forwarding, dual-stack,
and the nft engine's refusal to run from inside a pod netns."""

from __future__ import annotations

import os

import pytest

from tests.fixtures.bridge import (
    GATEWAY,
    bridge_conf,
    ip_of,  # noqa: F401
    masq_elements,
    pycni_ipam,
)

pytestmark = pytest.mark.netns
UPLINK_NODE, UPLINK_OUTSIDE = "192.168.77.1", "192.168.77.2"


@pytest.fixture
def outside(bridge_node, netns_factory):
    """A namespace beyond the node, joined by a veth, with no route back to the pod subnet."""
    ns = netns_factory("outside")
    node = bridge_node.node
    node.run(f"ip link add up0 type veth peer name down0 netns {ns.name}")
    node.run(f"ip addr add {UPLINK_NODE}/24 dev up0 && ip link set up0 up")
    ns.run(f"ip addr add {UPLINK_OUTSIDE}/24 dev down0 && ip link set down0 up")
    return ns


def test_masquerade_takes_pods_beyond_the_node(bridge_node, netns_factory, outside):
    masq, plain = netns_factory("pod"), netns_factory("pod")
    bridge_node.add(bridge_conf(pycni_ipam()), masq)
    bridge_node.add(
        bridge_conf(pycni_ipam("10.23.0.0/24"), name="nomasq", bridge="pycni1", ipMasq=False),
        plain,
    )
    assert masq.ping(UPLINK_OUTSIDE)  # leaves as the node's address
    assert not plain.ping(UPLINK_OUTSIDE, timeout=1)  # outside has no route back to 10.23/24


def test_add_enables_forwarding_in_the_node(bridge_node, netns_factory):
    bridge_node.node.run("sysctl -qw net.ipv4.ip_forward=0")
    bridge_node.add(bridge_conf(pycni_ipam()), netns_factory("pod"))
    assert bridge_node.node.run("sysctl -n net.ipv4.ip_forward").stdout.strip() == "1"


def test_dual_stack(bridge_node, netns_factory):
    ipam = {
        "type": "pycni-ipam",
        "ranges": [[{"subnet": "10.22.0.0/24"}], [{"subnet": "fd22::/64"}]],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
    }
    conf = bridge_conf(ipam, isDefaultGateway=True)
    a, b = netns_factory("pod"), netns_factory("pod")
    cid, res_a = bridge_node.add(conf, a)
    _, res_b = bridge_node.add(conf, b)
    assert [ip["address"].split("/")[1] for ip in res_a["ips"]] == ["24", "64"]
    v6_a, v6_b = ip_of(res_a, 1), ip_of(res_b, 1)
    assert a.ping("fd22::1") and a.ping(v6_b) and b.ping(v6_a) and a.ping(GATEWAY)
    assert len([e for e in masq_elements(bridge_node.node) if cid in e]) == 4
    check = bridge_node.run("CHECK", {**conf, "prevResult": res_a}, cid, a.path)
    assert check.code == 0, check.stdout
    assert bridge_node.run("DEL", conf, cid, "").code == 0
    assert not [e for e in masq_elements(bridge_node.node) if cid in e]


def test_nft_refuses_to_run_inside_a_pod_netns(netns_factory):
    from kernel.nft import Nft, WrongNetns
    from kernel.ns import entered

    pod = netns_factory("pod")
    nft = Nft()  # bound to this thread's netns; nothing is run in it
    fd = os.open(pod.path, os.O_RDONLY)
    try:
        with entered(fd), pytest.raises(WrongNetns):
            nft.run("add table inet must-not-exist")
    finally:
        os.close(fd)
    assert "must-not-exist" not in pod.run("nft list tables").stdout


def test_a_reused_address_reaches_its_new_pod_at_once(bridge_node, netns_factory):
    """An address reused after its Pod's DEL: the node's neighbour entry named the old Pod's
    MAC (a STALE entry lives on), and the node's packets went there until its probes failed,
    ~8 s (found by `make soak`: two pings in a row lost to a Pod a few seconds old). ADD
    points the entry at the new Pod; both families."""
    ipam = {
        "type": "pycni-ipam",
        "ranges": [[{"subnet": "10.22.0.0/24"}], [{"subnet": "fd22::/64"}]],
    }
    conf, node = bridge_conf(ipam), bridge_node.node
    first = netns_factory("pod")
    cid, res = bridge_node.add(conf, first, args="IP=10.22.0.50,fd22::50")
    assert node.ping("10.22.0.50") and node.ping("fd22::50")
    assert bridge_node.run("DEL", conf, cid, first.path).code == 0
    old = res["interfaces"][2]["mac"]
    for ip in ("10.22.0.50", "fd22::50"):  # as the kernel left it, whatever probes ran since
        node.run(f"ip neigh replace {ip} lladdr {old} dev pycni0 nud stale")
    second = netns_factory("pod")
    _, res = bridge_node.add(conf, second, args="IP=10.22.0.50,fd22::50")
    mac = res["interfaces"][2]["mac"]
    for ip in ("10.22.0.50", "fd22::50"):
        assert mac in node.run(f"ip neigh show {ip}").stdout
        assert node.ping(ip, timeout=1)

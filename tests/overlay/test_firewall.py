"""The VXLAN firewall: pycni's own table accepts VXLAN only from registered nodes' underlay
addresses (a hand-crafted VXLAN packet carrying an ICMP echo for a Pod reaches it from a peer,
not from another host on the underlay) and keeps VXLAN out of conntrack."""

from __future__ import annotations

import json
import sys

import pytest

from tests.fixtures.netns import Netns
from tests.fixtures.waiting import wait_for

from .pods import OverlayCluster, Pod, tcp_transfer

pytestmark = pytest.mark.etcd
SEND = """
import socket, struct, sys
def csum(data):
    data += b"\\0" * (len(data) % 2)
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xffff) + (total >> 16)
    return ~total & 0xffff
src, dst, mac, node, seq = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
icmp = struct.pack("!BBHHH", 8, 0, 0, 0x4242, seq) + b"pycni" * 8
icmp = icmp[:2] + struct.pack("!H", csum(icmp)) + icmp[4:]
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(icmp), seq, 0, 64, 1, 0,
                 socket.inet_aton(src), socket.inet_aton(dst))
ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
eth = bytes.fromhex(mac.replace(":", "")) + bytes.fromhex("6600000000fe") + b"\\x08\\x00"
vxlan = struct.pack("!II", 0x08000000, 1 << 8)
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    s.sendto(vxlan + eth + ip + icmp, (node, 4789))
"""


def echoes_received(pod: Pod) -> int:
    """ICMP echo requests the Pod's kernel has received (its SNMP counter)."""
    lines = pod.ns.run("cat /proc/net/snmp").stdout.splitlines()
    names, values = [line.split() for line in lines if line.startswith("Icmp:")][:2]
    return int(values[names.index("InEchos")])


def send_vxlan(sender: Netns, src: str, pod: Pod, mac: str, underlay: str, seq: int) -> None:
    sender.run([sys.executable, "-c", SEND, src, pod.ip, mac, underlay, str(seq)])


def test_vxlan_is_taken_only_from_registered_nodes_and_never_tracked(overlay_cluster):
    cluster: OverlayCluster = overlay_cluster("vxlan", nodes=2)
    target, other = cluster.nodes
    pod, peer_pod = cluster.add_pod(target), cluster.add_pod(other)
    mac = cluster.records()[target.name]["overlay"]["vtepMAC"]
    table = json.loads(target.host.ns.run("nft -j list set inet pycni-overlay peers4").stdout)
    members = [item["set"].get("elem", []) for item in table["nftables"] if "set" in item][0]
    assert members == [other.host.address]
    stranger = cluster.cluster.etcd.hosts[0].ns  # on the underlay, not a node
    before = echoes_received(pod)
    for seq in range(3):
        send_vxlan(stranger, peer_pod.ip, pod, mac, target.host.address, seq)
    send_vxlan(other.host.ns, peer_pod.ip, pod, mac, target.host.address, 9)
    wait_for("the peer's VXLAN echo at the Pod", lambda: echoes_received(pod) > before, 5)
    assert echoes_received(pod) == before + 1  # the stranger's three were dropped
    tcp_transfer(peer_pod, pod, 1 << 20)
    tracked = target.host.ns.run("conntrack -L -p udp --dport 4789", check=False)
    assert "dport=4789" not in tracked.stdout, tracked.stdout

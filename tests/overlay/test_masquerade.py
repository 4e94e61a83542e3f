"""ipMasq on an overlay: Pod to Pod inside the cluster's pools is never masqueraded, also between
two pools (the overlay keeps every cluster pool in the masquerade table's ``cluster`` sets);
traffic leaving the pools still is."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.fixtures.netns import Netns
from tests.fixtures.waiting import wait_for

from .pods import OverlayCluster, pod_conf

pytestmark = pytest.mark.etcd
SERVER = (
    "import socket,sys\n"
    "s=socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET)\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind((sys.argv[1], 7070)); s.listen(1); s.settimeout(20)\n"
    "c, peer = s.accept(); print(peer[0], flush=True)\n"
)


def seen_source(server: Netns, address: str, client: Netns) -> str:
    """The source address ``server`` sees on a TCP connection from ``client`` to ``address``."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", server.name, sys.executable, "-c", SERVER, address],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            f"a connection from {client.name} to {address}",
            lambda: (
                client.run(
                    [
                        sys.executable,
                        "-c",
                        "import socket,sys; socket.create_connection("
                        f"('{address}', 7070), timeout=1).close()",
                    ],
                    check=False,
                ).returncode
                == 0
            ),
            timeout=10,
            step=0.2,
        )
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
    return out.strip()


def test_pod_to_pod_between_pools_keeps_its_source_and_leaving_is_masqueraded(overlay_cluster):
    cluster: OverlayCluster = overlay_cluster("vxlan", nodes=2)
    cluster.add_pool("other", "10.141.0.0/16", 26)
    first = cluster.add_pod(cluster.nodes[0])
    second = cluster.add_pod(cluster.nodes[1], {**pod_conf("other"), "name": "othernet"})
    retry = first.ns.run("cat /proc/sys/net/ipv4/neigh/eth0/retrans_time_ms").stdout
    assert retry.strip() == "200"  # an unanswered ARP (a node joining) asks again soon
    assert seen_source(second.ns, second.ip, first.ns) == first.ip
    assert seen_source(first.ns, first.ip, second.ns) == second.ip
    outside = cluster.nodes[1].host
    assert seen_source(outside.ns, outside.address, first.ns) == cluster.nodes[0].host.address


def test_a_node_whose_networks_do_not_masquerade_gets_no_nat_table(overlay_cluster):
    cluster: OverlayCluster = overlay_cluster("host-gw", nodes=2)
    first = cluster.add_pod(cluster.nodes[0], pod_conf(ipMasq=False))
    second = cluster.add_pod(cluster.nodes[1], pod_conf(ipMasq=False))
    wait_for("host-gw across nodes", lambda: first.ns.ping(second.ip, timeout=1), 10, 0.2)
    for node in cluster.nodes:  # a NAT chain would switch conntrack on for every packet
        assert "pycni-masq" not in node.host.ns.run("nft list tables").stdout

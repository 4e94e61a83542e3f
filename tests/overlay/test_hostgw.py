"""host-gw routes only to peers on a directly connected subnet: a node whose underlay address
sits on a second link in another subnet gets no route on its peers, and each peer says so
(a log line, ``pycni_overlay_unreachable_peers``, `pycni node show`); the node itself still
routes to the peers it does reach, and the others still route to each other."""

from __future__ import annotations

import pytest

from tests.fixtures.waiting import wait_for

from .kernel import read_routes, wait_converged
from .pods import METRICS, OverlayCluster, pycni_cli, scrape

pytestmark = pytest.mark.etcd
FAR = "172.31.251.13"  # a subnet only the far node is on


@pytest.fixture(scope="module")
def hostgw(module_overlay) -> OverlayCluster:
    cluster = module_overlay("host-gw", nodes=2, daemon={"metricsAddress": METRICS})
    far = cluster.add_node("far", start=False, underlayAddress=FAR)
    far.host.ns.run(
        f"ip link add eth1 type veth peer name eth1p && ip link set eth1p up && "
        f"ip link set eth1 up && ip addr add {FAR}/24 dev eth1"
    )
    far.daemon.start()
    cluster.wait_vteps()
    for node in cluster.nodes:
        cluster.add_pod(node)  # a block on every node
    return cluster


def unreachable_peers(node) -> float:
    return scrape(node).get("pycni_overlay_unreachable_peers", -1)


def test_a_peer_not_on_a_connected_subnet_gets_no_route_and_is_reported(hostgw):
    near = hostgw.nodes[:2]
    assert hostgw.records()["far"]["overlay"]["underlay"] == FAR
    wait_converged(hostgw.cluster.etcd, hostgw.nodes, timeout=5, unreachable={"far"})
    for node in near:
        assert not [r for r in read_routes(node.host.ns) if r[1] == FAR]
        wait_for(
            f"{node.name}'s unreachable-peer gauge",
            lambda node=node: unreachable_peers(node) == 1,
            timeout=5,
        )
        assert "peer far gets no route" in node.daemon.log()
        shown = pycni_cli(node, "node", "show", "far")
        assert shown.returncode == 0 and "reachability: " in shown.stdout, shown.stderr
        assert "reachability: direct" not in shown.stdout, shown.stdout


def test_the_far_node_routes_to_the_peers_it_reaches(hostgw):
    far = hostgw.nodes[2]
    vias = {r[1] for r in read_routes(far.host.ns)}
    assert vias == {n.host.address for n in hostgw.nodes[:2]}
    assert unreachable_peers(far) == 0
    src, dst = hostgw.pods[:2]
    wait_for(f"{src.ip} -> {dst.ip}", lambda: src.ns.ping(dst.ip, timeout=1), 10, 0.2)

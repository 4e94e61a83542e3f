"""Full mesh across nodes: every Pod reaches every Pod on another node by its Pod IP, by ping
and by a TCP transfer, for both backends; every node holds exactly its peers' entries; a Pod
holding a borrowed address is reachable from every node, by a host route that goes with it,
and `pycni doctor` finds every entry of a live overlay explained.

One cluster per backend for the module (three nodes, two Pods each): the tests add Pods
(the borrower goes again) and change nothing else."""

from __future__ import annotations

import itertools
import os

import pytest

from tests.fixtures.doctor import assert_doctor_clean
from tests.fixtures.waiting import wait_for

from .kernel import Registry, read_routes, wait_converged
from .pods import NETWORK, OverlayCluster, Pod, pod_conf, tcp_transfer

pytestmark = pytest.mark.etcd
TRANSFER = 4 << 20
SMALL = pod_conf("small", name="smallnet", bridge="pycni1")


@pytest.fixture(scope="module", params=["vxlan", "host-gw"])
def mesh(request, module_overlay) -> OverlayCluster:
    cluster = module_overlay(request.param, daemon={"ipam": {"bufferSize": 0}})
    for node in cluster.nodes:
        cluster.add_pod(node)
        cluster.add_pod(node)
    return cluster


def wait_ping(src: Pod, dst: Pod, timeout: float = 10.0) -> None:
    wait_for(
        f"{src.ip} ({src.node.name}) -> {dst.ip} ({dst.node.name})",
        lambda: src.ns.ping(dst.ip, timeout=1),
        timeout,
        step=0.2,
    )


def cross_pairs(pods: list[Pod]) -> list[tuple[Pod, Pod]]:
    return [(a, b) for a, b in itertools.permutations(pods, 2) if a.node is not b.node]


def test_full_mesh_ping_between_pods_on_three_nodes(mesh):
    for src, dst in cross_pairs(mesh.pods):
        wait_ping(src, dst)


def test_every_node_holds_its_peers_entries_and_nothing_else(mesh):
    wait_converged(mesh.cluster.etcd, mesh.nodes, timeout=5)
    for node in mesh.nodes:
        others = [n for n in mesh.nodes if n is not node]
        assert {r[0] for r in read_routes(node.host.ns)} == set().union(
            *(Registry.read(mesh.cluster.etcd).blocks[n.name] for n in others)
        )


def test_tcp_transfer_between_every_pair_of_nodes(mesh):
    first = {pod.node.name: pod for pod in reversed(mesh.pods)}  # one Pod per node
    for src, dst in itertools.permutations(first.values(), 2):
        wait_ping(src, dst)
        sent, received = tcp_transfer(src, dst, TRANSFER)
        assert sent == received, f"{src.node.name} -> {dst.node.name}"
        assert sent.startswith(f"{TRANSFER} ")


def add_borrower(mesh: OverlayCluster) -> Pod:
    """Pool ``small`` has two blocks: node1 and node2 claim one each, node3 must borrow."""
    mesh.add_pool("small", "10.132.0.0/27", 28)
    for node in mesh.nodes[:2]:
        mesh.add_pod(node, SMALL)
    pod = mesh.add_pod(mesh.nodes[2], SMALL)
    assert pod.ip in {h.split("/")[0] for h in Registry.read(mesh.cluster.etcd).hosts["node3"]}
    return pod


def host_routes(mesh: OverlayCluster, ip: str) -> dict[str, set]:
    return {n.name: {r for r in read_routes(n.host.ns) if r[0] == f"{ip}/32"} for n in mesh.nodes}


def test_a_pod_on_a_borrowed_address_is_reachable_from_every_node(mesh):
    pod = add_borrower(mesh)
    wait_converged(mesh.cluster.etcd, mesh.nodes, bridge="pycni1")
    holder = mesh.records()["node3"]["overlay"]
    via = holder["vteps"][0] if mesh.backend == "vxlan" else holder["underlay"]
    dev = "pycni.1" if mesh.backend == "vxlan" else "eth0"
    assert host_routes(mesh, pod.ip) == {
        "node1": {(f"{pod.ip}/32", via, dev)},
        "node2": {(f"{pod.ip}/32", via, dev)},
        "node3": {(f"{pod.ip}/32", None, "pycni1")},
    }
    for src in [p for p in mesh.pods if p.node is not pod.node]:
        wait_ping(src, pod)
    for node in mesh.nodes[:2]:
        assert node.host.ns.ping(pod.ip), f"{node.name} -> {pod.ip}"
    for node in (mesh.nodes[0], mesh.nodes[2]):  # a peer's host route and the holder's
        config = os.path.join(node.daemon.workdir, "pycnid.json")
        assert_doctor_clean(node.host.ns, config, networks=(NETWORK, SMALL["name"]))
    mesh.del_pod(pod, SMALL)
    wait_converged(mesh.cluster.etcd, mesh.nodes, bridge="pycni1")
    assert host_routes(mesh, pod.ip) == {"node1": set(), "node2": set(), "node3": set()}

"""Nodes joining, leaving and coming back: every peer has the entries of a node that joins,
and loses those of one that leaves (a graceful stop with ``leaveOnStop``, or `pycni node rm`),
as soon as the watch brings the registry change; a crashed node keeps its entries on its
peers, even once its heartbeat has expired (a lost heartbeat removes nothing); a node that
comes back with a new underlay address and a new VTEP MAC leaves nothing of its old self on
any peer — the FDB entries and neighbours flannel leaves stale.

The waits (``kernel.BOUND``) are well inside the 30 s resync, so only the watch can have
converged the peers; the one second the overlay promises is `make bench-overlay`'s figure.
One cluster for the module:
two nodes that stay, and the nodes each test adds and takes out again."""

from __future__ import annotations

import pytest

from tests.fixtures.cluster import ClusterNode
from tests.fixtures.waiting import wait_for

from .kernel import BOUND, State, read_state, wait_converged
from .pods import OverlayCluster, pycni_cli, running

pytestmark = pytest.mark.etcd
NEW_MAC = "66:0a:0b:0c:0d:0e"


@pytest.fixture(scope="module")
def churn(module_overlay) -> OverlayCluster:
    return module_overlay("vxlan", nodes=2, daemon={"ipam": {"heartbeatTTL": 2}})


def wait_record(churn: OverlayCluster, name: str, ready=lambda o: bool(o["vteps"])) -> dict:
    """The node record's overlay object once ``ready`` holds of it (seen at a 20 ms poll)."""

    def probe() -> dict | None:
        overlay = churn.records().get(name, {}).get("overlay")
        return overlay if overlay and ready(overlay) else None

    return wait_for(f"{name}'s overlay fields", probe, timeout=20, step=0.02)


def join(
    churn: OverlayCluster, name: str | None = None, **overlay: object
) -> tuple[ClusterNode, dict]:
    node = churn.add_node(name, **overlay)
    info = wait_record(churn, node.name)
    wait_converged(churn.cluster.etcd, running(churn.nodes), BOUND)
    return node, info


def peers_naming(churn: OverlayCluster, info: dict, node: ClusterNode) -> dict[str, State]:
    """What each running node other than ``node`` holds that leads to ``info``'s node."""
    return {
        n.name: read_state(n.host.ns).naming(info) for n in running(churn.nodes) if n is not node
    }


def test_a_node_joins_and_leaves_on_stop_on_every_peer_within_a_second(churn):
    node, info = join(churn, leaveOnStop=True)
    held = peers_naming(churn, info, node)
    assert all(state.fdbs and state.neighs and state.routes for state in held.values()), held
    assert node.daemon.stop() == 0
    assert node.name not in churn.records()
    wait_converged(churn.cluster.etcd, running(churn.nodes), BOUND)
    assert not any(peers_naming(churn, info, node).values())
    assert not read_state(node.host.ns)  # it took its own entries for its peers out too


def test_a_crashed_node_keeps_its_entries_until_pycni_node_rm_takes_it_out(churn):
    node, info = join(churn)
    held = peers_naming(churn, info, node)
    node.daemon.kill()
    wait_for(
        "its heartbeat to expire",
        lambda: not churn.cluster.etcd.dump(f"/pycni/v1/heartbeats/{node.name}"),
        timeout=15,
        step=0.2,
    )
    assert peers_naming(churn, info, node) == held
    out = pycni_cli(churn.nodes[0], "node", "rm", node.name)
    assert out.returncode == 0, out.stdout + out.stderr
    assert node.name not in churn.records()
    wait_converged(churn.cluster.etcd, running(churn.nodes), BOUND)
    assert not any(peers_naming(churn, info, node).values())


def test_a_node_back_with_a_new_underlay_and_vtep_mac_leaves_nothing_stale(churn):
    old, before = join(churn, "nodeback")
    old.daemon.kill()  # no leave: its record stays as it was, for the new one to replace
    new = churn.add_node("nodeback", vtepMAC=NEW_MAC)
    after = wait_record(churn, new.name, lambda o: o["vtepMAC"] == NEW_MAC)
    assert after["underlay"] == new.host.address != before["underlay"]
    wait_converged(churn.cluster.etcd, running(churn.nodes), BOUND)
    assert not any(peers_naming(churn, {**before, "vteps": []}, new).values())
    assert all(
        s.fdbs == {(NEW_MAC, new.host.address)} for s in peers_naming(churn, after, new).values()
    )


def test_pycni_node_rm_force_takes_a_node_out_while_its_heartbeat_lives(churn):
    node, info = join(churn)
    node.daemon.kill()  # its heartbeat lives on for up to heartbeatTTL
    out = pycni_cli(churn.nodes[0], "node", "rm", node.name, "--force")
    assert out.returncode == 0, out.stdout + out.stderr
    wait_converged(churn.cluster.etcd, running(churn.nodes), BOUND)
    assert not any(peers_naming(churn, info, node).values())

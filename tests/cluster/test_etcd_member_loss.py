"""Three nodes against a 3-member etcd cluster (one member per control-plane namespace) while
the raft leader is SIGKILLed in the middle of the ADDs and restarted: no address is handed out
twice, no allocation is lost, and every failed ADD is code 11, left nothing, and succeeds when
retried. `make test` runs 100 ADDs per node (two /26 blocks each), `make long` 300."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.scale import sized

from .checks import (
    assert_cli_checks_clean,
    assert_handles_match,
    assert_no_duplicates,
    assert_only_buffers_left,
    assert_store_consistent,
    cli_check,
    store_view,
)
from .load import NETWORK, interleave, netconf, run_all, run_with_incident

pytestmark = [
    pytest.mark.netns,
    pytest.mark.etcd,
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.drill,
]

ADDS_PER_NODE = sized(100, 300)
IN_FLIGHT_PER_NODE = 16
DOWN_SECONDS = 2.0


def test_leader_killed_and_restarted_mid_run(make_cluster, cni_bin):
    cluster = make_cluster(nodes=3, etcd_members=3)
    conf = netconf()
    victim = cluster.etcd.leader()

    def lose_leader() -> None:
        victim.kill()
        time.sleep(DOWN_SECONDS)
        victim.start(timeout=30)

    adds, before = run_with_incident(
        cni_bin,
        interleave(cluster.nodes, "ADD", ADDS_PER_NODE),
        conf,
        after=ADDS_PER_NODE,
        incident=lose_leader,
        per_node=IN_FLIGHT_PER_NODE,
    )
    assert before < 3 * ADDS_PER_NODE, "the leader was killed only after every ADD finished"
    failed = [c for c in adds if not c.ok]
    print(
        f"leader {victim.name} killed after {before} ADDs; {len(failed)} failed; "
        f"slowest ADD {max(c.seconds for c in adds):.2f}s"
    )
    assert {c.code for c in failed} <= {11}, {c.code: c.run.stdout for c in failed}
    cluster.etcd.wait_healthy()

    view = store_view(cluster)  # before any retry: successes all there, failures left nothing
    assert_store_consistent(view)
    assert_handles_match(view, adds)
    assert_no_duplicates(adds)
    checks = [cli_check(cluster, "after the member loss")]

    nodes = {n.name: n for n in cluster.nodes}
    retried = run_all(cni_bin, [(nodes[c.node], "ADD", c.cid) for c in failed], conf)
    assert all(c.ok for c in retried), [c.run.stdout for c in retried if not c.ok][:3]
    succeeded = [c for c in adds if c.ok] + retried
    assert len(succeeded) == 3 * ADDS_PER_NODE
    assert_no_duplicates(succeeded)
    view = store_view(cluster)
    assert_store_consistent(view)
    assert_handles_match(view, succeeded)

    dels = run_all(
        cni_bin, interleave(cluster.nodes, "DEL", ADDS_PER_NODE), conf, per_node=IN_FLIGHT_PER_NODE
    )
    assert all(c.ok for c in dels), [c.run.stdout for c in dels if not c.ok][:3]
    view = store_view(cluster)
    assert_store_consistent(view)
    assert_only_buffers_left(view, NETWORK)
    checks.append(cli_check(cluster, "after DEL of every attachment"))
    assert_cli_checks_clean(checks)
    print(
        f"\netcd leader kill drill: {len(adds)} ADDs tried ({len(failed)} code 11, retried), "
        f"{len(succeeded)} survived (no address twice), {len(adds) - len(succeeded)} lost"
    )

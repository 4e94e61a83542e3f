"""Three node namespaces, each with its own pycnid, against one etcd in the control plane:
ADDs on every node at once through the real pycni-ipam executable, then DEL of all. `make test`
runs 100 per node (two /26 blocks each, so every node claims a second block while the others
are claiming theirs); `make long` runs 300 per node."""

from __future__ import annotations

import pytest

from tests.fixtures.scale import sized

from .checks import (
    assert_cli_checks_clean,
    assert_from_own_blocks,
    assert_handles_match,
    assert_no_duplicates,
    assert_only_buffers_left,
    assert_store_consistent,
    cli_check,
    store_view,
)
from .load import interleave, netconf, run_all

pytestmark = [pytest.mark.netns, pytest.mark.etcd, pytest.mark.slow, pytest.mark.long]

ADDS_PER_NODE = sized(100, 300)
IN_FLIGHT_PER_NODE = 16


def test_three_nodes_concurrent_adds_each_then_del_all(make_cluster, cni_bin):
    cluster = make_cluster(nodes=3, etcd_members=1)
    conf = netconf()

    adds = run_all(
        cni_bin, interleave(cluster.nodes, "ADD", ADDS_PER_NODE), conf, per_node=IN_FLIGHT_PER_NODE
    )
    failed = [(c.node, c.cid, c.run.stdout) for c in adds if not c.ok]
    assert not failed, f"{len(failed)} ADD(s) failed: {failed[:5]}"
    assert_no_duplicates(adds)
    assert len({ip for c in adds for ip in c.ips()}) == 3 * ADDS_PER_NODE
    view = store_view(cluster)
    assert_store_consistent(view)
    assert_handles_match(view, adds)
    assert_from_own_blocks(view)
    checks = [cli_check(cluster, "after the ADDs")]

    dels = run_all(
        cni_bin, interleave(cluster.nodes, "DEL", ADDS_PER_NODE), conf, per_node=IN_FLIGHT_PER_NODE
    )
    failed = [(c.node, c.cid, c.run.stdout) for c in dels if not c.ok]
    assert not failed, f"{len(failed)} DEL(s) failed: {failed[:5]}"
    view = store_view(cluster)
    assert_store_consistent(view)
    assert_only_buffers_left(view)
    checks.append(cli_check(cluster, "after the DELs"))
    assert_cli_checks_clean(checks)

"""etcd stopped under a running node: ADDs are served from the node's pre-reserved buffer
(`/pycni/v1/handles/_buffer/<node>/<pool>`), then answer code 11 within 3 s once it is empty;
STATUS is 50 throughout; after etcd restarts the journal is replayed (handles reconciled with
the addresses the ADDs returned) and the store checks clean."""

from __future__ import annotations

from functools import partial

import pytest

from tests.fixtures import waiting

from .checks import (
    assert_cli_checks_clean,
    assert_no_duplicates,
    assert_only_buffers_left,
    assert_store_consistent,
    cli_check,
    store_view,
)
from .invariants import StoreView
from .load import NETWORK, Call, ipam, netconf

pytestmark = [pytest.mark.netns, pytest.mark.etcd, pytest.mark.slow]

BUFFER_WAIT = 15.0
RECONCILE_WAIT = 30.0


def buffer_ips(view: StoreView, node: str) -> set[str]:
    return {
        ip
        for holder in view.handles
        if holder.startswith(f"_buffer/{node}/")
        for ip in view.handle_ips(holder)
    }


wait_for = partial(waiting.wait_for, step=0.3)  # each probe reads the store or runs STATUS


def test_outage_served_from_buffer_then_11_then_reconciled(make_cluster, cni_bin):
    cluster = make_cluster(nodes=1, etcd_members=1)
    node, etcd = cluster.nodes[0], cluster.etcd.members[0]
    conf = netconf()
    first = ipam(cni_bin, node, "ADD", conf, "before")
    assert first.ok, first.run.stdout
    buffered = wait_for(
        "the node's outage buffer to be reserved in etcd",
        lambda: buffer_ips(store_view(cluster), node.name),
        BUFFER_WAIT,
    )
    assert not buffered & set(first.ips())

    etcd.stop()
    status = ipam(cni_bin, node, "STATUS", conf)
    assert status.code == 50, status.run.stdout
    served: list[Call] = []
    for i in range(len(buffered)):
        call = ipam(cni_bin, node, "ADD", conf, f"outage{i}")
        assert call.ok, f"ADD {i} of {len(buffered)} buffered failed: {call.run.stdout}"
        served.append(call)
    assert sorted(ip for c in served for ip in c.ips()) == sorted(buffered)
    empty = ipam(cni_bin, node, "ADD", conf, "overflow")
    assert empty.code == 11, empty.run.stdout
    assert empty.seconds < 3.0, f"code 11 took {empty.seconds:.2f}s (limit 3 s)"
    assert ipam(cni_bin, node, "STATUS", conf).code == 50
    released = served.pop()
    assert ipam(cni_bin, node, "DEL", conf, released.cid).ok  # journalled

    etcd.start()
    expected = {f"{NETWORK}/{c.cid}/eth0": sorted(c.ips()) for c in [first] + served}

    def reconciled() -> StoreView | None:
        view = store_view(cluster)
        pods = {h: sorted(ips) for h, ips in view.pod_handles(NETWORK).items()}
        return view if pods == expected else None

    view = wait_for("the outage journal to be replayed into etcd", reconciled, RECONCILE_WAIT)
    assert_store_consistent(view)
    holder = view.allocations().get(released.ips()[0])
    assert holder is None or holder.startswith("_buffer/"), (
        f"{released.ips()[0]}, DELeted during the outage, is still held by {holder}"
    )
    wait_for("STATUS to recover", lambda: ipam(cni_bin, node, "STATUS", conf).ok, RECONCILE_WAIT)
    checks = [cli_check(cluster, "after the journal replay")]

    retried = ipam(cni_bin, node, "ADD", conf, "overflow")
    assert retried.ok, retried.run.stdout
    assert_no_duplicates([first, retried] + served)
    for call in [first, retried] + served:
        assert ipam(cni_bin, node, "DEL", conf, call.cid).ok
    view = store_view(cluster)
    assert_store_consistent(view)
    assert_only_buffers_left(view, NETWORK)
    checks.append(cli_check(cluster, "after DEL of every attachment"))
    assert_cli_checks_clean(checks)

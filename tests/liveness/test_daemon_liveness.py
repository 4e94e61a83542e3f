"""Liveness and reclamation with real pycnid processes on an underlay, etcd in a control-plane
namespace: the heartbeat lives with the daemon and goes after SIGKILL + TTL; a dead node's
addresses are reclaimed by another node's reaper (periodic, or the CNI GC verb) only after the
grace period confirmed on a second look, and a live node's never."""

from __future__ import annotations

import json
import time

import pytest

from tests.cluster.checks import (
    assert_cli_checks_clean,
    assert_store_consistent,
    cli_check,
    store_view,
)
from tests.cluster.load import ipam, netconf, pycni_ipam_cli
from tests.fixtures.waiting import wait_for

pytestmark = [pytest.mark.netns, pytest.mark.etcd, pytest.mark.slow]
HEARTBEATS, NODES = "/pycni/v1/heartbeats/", "/pycni/v1/nodes/"
SUSPECTS = "/pycni/v1/reaper/suspects/"


def node_handles(view, node: str) -> dict[str, list[str]]:
    return {
        h: view.handle_ips(h)
        for h, rec in view.handles.items()
        if rec.get("attributes", {}).get("node") == node
    }


def add_pods(cni_bin, node, conf, count: int) -> list[str]:
    ips = []
    for i in range(count):
        call = ipam(cni_bin, node, "ADD", conf, f"{node.name}-pod{i}")
        assert call.ok, call.run.stdout + node.daemon.log()[-2000:]
        ips += call.ips()
    return ips


def test_heartbeat_lives_with_the_daemon_and_goes_after_sigkill_and_ttl(make_cluster):
    cluster = make_cluster(nodes=1, ipam={"heartbeatTTL": 2})
    node, etcd = cluster.nodes[0], cluster.etcd
    beat = HEARTBEATS + node.name
    wait_for("the heartbeat", lambda: beat in etcd.dump(), 10)
    record = json.loads(etcd.dump()[NODES + node.name][0])
    assert record["name"] == node.name and record["address"] == node.host.address
    time.sleep(3)  # longer than the TTL: the keepalive loop holds it
    assert beat in etcd.dump()

    node.daemon.kill()
    killed = time.monotonic()
    wait_for("the heartbeat to expire", lambda: beat not in etcd.dump(), 8)
    assert time.monotonic() - killed <= 2 + 1.5  # TTL + etcd's expiry granularity
    assert NODES + node.name in etcd.dump()  # the record stays: it is no proof of death

    revision = etcd.dump()[NODES + node.name][1]
    node.daemon.start()
    wait_for("the heartbeat after a restart", lambda: beat in etcd.dump(), 10)
    assert etcd.dump()[NODES + node.name][1] > revision  # re-announced
    node.daemon.stop()
    assert beat not in etcd.dump()  # a clean stop revokes the lease at once


def test_a_dead_nodes_addresses_are_reaped_after_grace_by_the_periodic_reaper(
    make_cluster, cni_bin
):
    grace = 5.0
    cluster = make_cluster(
        nodes=2, ipam={"heartbeatTTL": 2, "reapGrace": grace, "reapInterval": 0.5, "bufferSize": 2}
    )
    live, dead = cluster.nodes
    conf = netconf()
    live_ips = add_pods(cni_bin, live, conf, 3)
    dead_ips = add_pods(cni_bin, dead, conf, 3)
    wait_for(
        "both buffers",
        lambda: all(
            f"_buffer/{n.name}/clusternet-10.96.0.0-20" in store_view(cluster).handles
            for n in cluster.nodes
        ),
        10,
    )
    before = node_handles(store_view(cluster), live.name)
    assert len(before) == 4  # 3 pods + the outage buffer

    dead.daemon.kill()
    killed = time.monotonic()
    since = wait_for("the first look", lambda: cluster.etcd.dump().get(SUSPECTS + dead.name), 10)
    suspected = time.monotonic()
    assert json.loads(since[0])["node"] == dead.name
    while time.monotonic() - suspected < grace - 1:  # within the grace: nothing taken
        view = store_view(cluster)
        assert sorted(
            ip for ips in node_handles(view, dead.name).values() for ip in ips
        ) == sorted(dead_ips + view.handle_ips(f"_buffer/{dead.name}/clusternet-10.96.0.0-20"))
        time.sleep(0.25)
    view = wait_for(
        "the reclamation",
        lambda: (v := store_view(cluster)) and not node_handles(v, dead.name) and v,
        15,
    )
    assert time.monotonic() - killed >= grace
    assert node_handles(view, live.name) == before  # never the live node's
    assert not set(dead_ips) & set(view.allocations())
    assert set(live_ips) <= set(view.allocations())
    cooling = {
        ip
        for rec in view.blocks.values()
        if rec.get("affinity") == dead.name
        for ip in rec.get("released", {})
    }
    assert set(dead_ips) <= cooling  # freed with their reuse delay: the block returns later
    assert SUSPECTS + dead.name in cluster.etcd.dump()  # so the reaper looks again
    assert_store_consistent(view)


def test_the_gc_verb_of_any_node_reaps_only_on_a_second_look_after_the_grace(
    make_cluster, cni_bin
):
    grace = 3.0
    cluster = make_cluster(
        nodes=2, ipam={"heartbeatTTL": 2, "reapGrace": grace, "reapInterval": 0, "bufferSize": 0}
    )
    live, dead = cluster.nodes
    conf = netconf()
    live_ips = add_pods(cni_bin, live, conf, 2)
    dead_ips = add_pods(cni_bin, dead, conf, 2)
    gc_conf = {
        **conf,
        "cni.dev/valid-attachments": [
            {"containerID": f"{live.name}-pod{i}", "ifname": "eth0"} for i in range(2)
        ],
    }

    def gc() -> None:
        call = ipam(cni_bin, live, "GC", gc_conf)
        assert call.ok, call.run.stdout

    gc()  # heartbeat still there: nothing suspected
    assert SUSPECTS + dead.name not in cluster.etcd.dump()
    dead.daemon.kill()
    wait_for(
        "the heartbeat to expire", lambda: HEARTBEATS + dead.name not in cluster.etcd.dump(), 8
    )
    gc()  # first look
    assert SUSPECTS + dead.name in cluster.etcd.dump()
    gc()  # second look within the grace
    assert sorted(
        ip for ips in node_handles(store_view(cluster), dead.name).values() for ip in ips
    ) == sorted(dead_ips)
    time.sleep(grace)
    gc()  # second look after the grace
    view = store_view(cluster)
    assert node_handles(view, dead.name) == {}
    assert sorted(ip for ips in node_handles(view, live.name).values() for ip in ips) == sorted(
        live_ips
    )
    assert_store_consistent(view)


def test_release_node_from_the_cli_refuses_a_live_node_then_releases_a_dead_one(
    make_cluster, cni_bin
):
    cluster = make_cluster(nodes=2, ipam={"heartbeatTTL": 2, "reapInterval": 0, "bufferSize": 2})
    live, dead = cluster.nodes
    conf = netconf()
    live_ips = add_pods(cni_bin, live, conf, 2)
    add_pods(cni_bin, dead, conf, 2)
    refused = pycni_ipam_cli(live, "release-node", dead.name, "--output", "json")
    assert refused.returncode != 0 and f"node {dead.name} is alive" in refused.stderr
    dead.daemon.kill()
    wait_for(
        "the heartbeat to expire", lambda: HEARTBEATS + dead.name not in cluster.etcd.dump(), 8
    )
    done = pycni_ipam_cli(live, "release-node", dead.name, "--output", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["complete"] and len(report["released"]) == 3  # 2 pods + the buffer
    view = store_view(cluster)
    assert node_handles(view, dead.name) == {}
    assert sorted(
        ip for ips in node_handles(view, live.name).values() for ip in ips if ip in live_ips
    ) == sorted(live_ips)
    assert_store_consistent(view)
    assert_cli_checks_clean([cli_check(cluster, "after release-node")])

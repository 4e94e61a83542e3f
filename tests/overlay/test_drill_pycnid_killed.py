"""Drill: pycnid SIGKILLed again and again on an overlay node under Pod churn, with the Service
proxy and NetworkPolicy on.

Three nodes with the VXLAN overlay, the Service proxy and NetworkPolicy, on one etcd; the
Pods, the Service, the policy and the traffic of tests/overlay/drill_cluster.py (Pod to Pod
across nodes, through the Service, under the policy, and a denied pair), a new connection
every 0.1 s for the whole drill. Every node churns Pods through the pycni-bridge executable
(an ADD every 0.3 s, a DEL every other time, a failed DEL tried again at the next turn), and
node2's pycnid, the node of web-0 (the policy's and the Service's backend), is SIGKILLed
``KILLS`` times, each time once the churn has made calls on it since the last restart, and
started again at once. Then the runtime's DEL of every Pod whose ADD failed.

Survived means: the other nodes never withdrew node2's routes (a restart used to announce
node2 without its overlay fields for ~0.1 s, and the peers dropped its routes: a new
connection to its Pods lost its first SYN); every failed ADD or DEL was code 11, and the
follow-up DEL of each failed ADD and the repeated DEL of each Pod whose DEL failed (a kill
cuts a DEL half-way: veth or lease gone, the Pod not yet) succeeded; the store's handles are
exactly the live Pods, none twice, and check clean; every live Pod answers a ping from
another node; the allowed traffic lost no probe while pycnid was being killed and the denied
pair was never answered; every node is doctor-clean (no veth, lease, route, neighbour,
masquerade, Service or policy element of a gone Pod). Prints
"pycnid killed on an overlay node: N tried, N survived, 0 lost" (N: the Pods the churn added).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.cluster.checks import (
    assert_handles_match,
    assert_no_duplicates,
    assert_store_consistent,
    store_view,
)
from tests.fixtures.doctor import assert_doctor_clean
from tests.fixtures.scale import sized
from tests.fixtures.waiting import wait_for

from .churn import Churn
from .drill_cluster import DrillCluster
from .pods import METRICS, NETWORK, OverlayCluster

pytestmark = [
    pytest.mark.netns,
    pytest.mark.etcd,
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.drill,
]

KILLS = sized(3, 10)
CHURN_INTERVAL = 0.3  # per node: an ADD every interval, a DEL every other
DAEMON = {
    "services": {"proxy": True},
    "networkPolicy": {"enforce": True},
    "metricsAddress": METRICS,
}
PHASES = {"kills": ("kills", "killed")}  # phase -> (mark, mark)


def kill_under_churn(drill: DrillCluster, churn: Churn) -> int:
    """node2's pycnid SIGKILLed ``KILLS`` times under the churn, each once the churn has made
    two calls on node2 since the last start, and started again at once; returns the kills."""
    victim = drill.cluster.nodes[1]
    for _ in range(KILLS):
        made = sum(1 for c in churn.calls if c.node == victim.name)
        wait_for(
            f"the churn calling {victim.name}",
            lambda made=made: sum(1 for c in churn.calls if c.node == victim.name) >= made + 2,
            30,
            0.02,
        )
        victim.daemon.kill()
        victim.daemon.start()
    return KILLS


def watch_routes(drill: DrillCluster, workdir: str) -> list[tuple[subprocess.Popen, str]]:
    """``ip monitor route`` on node1 and node3, each into a file of ``workdir``: (process,
    file)."""
    watches = []
    for node in (drill.cluster.nodes[0], drill.cluster.nodes[2]):
        path = os.path.join(workdir, f"routes-{node.name}")
        with open(path, "w") as out:
            argv = ["ip", "netns", "exec", node.host.ns.name, "ip", "monitor", "route"]
            watches.append((subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT), path))
    return watches


def withdrawn_routes(watches: list[tuple[subprocess.Popen, str]]) -> list[str]:
    """The pycni routes (protocol 77) the watched nodes deleted; the watches stopped."""
    found = []
    for proc, path in watches:
        proc.terminate()
        proc.wait(10)
        with open(path) as fh:
            found += [
                line.strip() for line in fh if line.startswith("Deleted") and "proto 77" in line
            ]
    return found


def test_pycnid_killed_under_churn_on_an_overlay_node_keeps_traffic_and_leaves_nothing(
    overlay_cluster, tmp_path
) -> None:
    cluster: OverlayCluster = overlay_cluster("vxlan", nodes=3, daemon=DAEMON)
    drill = DrillCluster(cluster, str(tmp_path))
    churn = Churn(cluster, CHURN_INTERVAL)
    watches: list[tuple[subprocess.Popen, str]] = []
    try:
        drill.setup()
        churn.phase = "kills"
        drill.mark("kills")
        watches = watch_routes(drill, str(tmp_path))
        churn.start()
        kills = kill_under_churn(drill, churn)
        churn.stop()
        drill.mark("killed")
        withdrawn, watches = withdrawn_routes(watches), []
        assert not withdrawn, (
            f"a peer withdrew a route while node2's pycnid restarted: {withdrawn}"
        )
        failed = churn.failed()
        assert {c.code for c in failed} <= {11}, {c.code: c.run.stdout for c in failed}
        churn.phase = "follow-up"
        follow_up = churn.follow_failed_adds("DEL")  # kubelet tears the sandbox down
        follow_up += churn.follow_failed_dels()  # and repeats a teardown a kill cut
        assert all(c.ok for c in follow_up), [c.run.stdout for c in follow_up if not c.ok][:3]
        live = churn.live() + drill.pod_calls()
        assert_no_duplicates(live)
        view = store_view(cluster.cluster)
        assert_store_consistent(view)
        assert_handles_match(view, live, NETWORK)
        drill.assert_reachable(live)
        for node in cluster.nodes:
            config = f"{node.daemon.workdir}/pycnid.json"
            assert_doctor_clean(node.host.ns, config, networks=(NETWORK,))
    finally:
        churn.stop()
        withdrawn_routes(watches)
        drill.close()
    windows = drill.windows(PHASES)
    tried, cut = churn.pods(), {c.cid for c in failed if c.command == "ADD"}
    print(
        f"\npycnid killed on an overlay node: {tried} tried, {tried} survived, 0 lost "
        f"({kills} kills; {len(cut)} ADDs and {sum(c.command == 'DEL' for c in failed)} DELs "
        "cut, code 11, their Pods deleted or retried)"
    )
    for kind, phases in windows.items():
        window = phases["kills"]
        print(f"  {kind}: {window.tried} probes, {window.lost} lost, {window.answered} answered")
    drill.assert_traffic(PHASES)

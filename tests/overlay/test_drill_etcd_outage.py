"""Drill: an etcd member lost, then the whole etcd stopped, under three working nodes.

Three nodes with the VXLAN overlay, the Service proxy and NetworkPolicy on, against a 3-member
etcd; the Pods, the Service, the policy and the traffic of tests/overlay/drill_cluster.py
(Pod to Pod across nodes, through the Service, under the policy, and a denied pair), a new
connection every 0.1 s for the whole drill.

1. The etcd leader is SIGKILLed: Pod churn starts on every node (an ADD through the
   pycni-bridge executable every 0.5 s, a DEL every other time) and a Service made now is
   programmed on every node.
2. The other two members are stopped for the outage (8 s; `make drills`: 30 s) while the churn
   goes on (ADDs served from each node's outage buffer, then code 11; DELs journalled) and an
   operator keeps trying to create the Service drill/metrics (81 → 9100) and to apply the
   policy drill/metrics (TCP 9100 from anywhere): each attempt is refused cleanly (exit 1, one
   line naming etcd) until etcd is back.
3. The three members start again and nothing is done by hand: both changes are accepted and
   every node's kernel shows them (read from nft; the seconds after etcd's return are
   printed, never asserted), the outage journal is written back, the ADDs that failed succeed
   when the runtime retries them.

Survived means: every failed ADD or DEL was code 11; no address is held twice and the store's
handles are exactly the live Pods (those served during the outage included) and check clean;
every live Pod answers a ping from another node; the allowed traffic lost no probe in any
phase and the denied pair was never answered; the changes carry traffic; every node is
doctor-clean. Prints "etcd outage: N tried, N survived, 0 lost" (N: the Pods the churn added
with a member lost or etcd down) and the probes lost per second of each kind of traffic.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from netpol.render import TABLE
from store.keys import SERVICES, netpol_key
from tests.cluster.checks import (
    assert_handles_match,
    assert_no_duplicates,
    assert_store_consistent,
    store_view,
)
from tests.cluster.load import Call
from tests.fixtures.cluster import ClusterNode
from tests.fixtures.doctor import assert_doctor_clean
from tests.fixtures.scale import sized
from tests.fixtures.waiting import wait_for

from .changes import Attempts, first_seen
from .churn import Churn
from .drill_cluster import DENIED, NS, DrillCluster, web_policy
from .pods import METRICS, NETWORK, OverlayCluster
from .probes import reaches
from .svc_policy_helpers import has_element

pytestmark = [
    pytest.mark.netns,
    pytest.mark.etcd,
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.drill,
]

OUTAGE = sized(8.0, 30.0)  # seconds with every etcd member stopped
CHURN_INTERVAL = sized(0.5, 1.0)  # per node: an ADD every interval, a DEL every other
DAEMON = {
    "services": {"proxy": True},
    "networkPolicy": {"enforce": True},
    "metricsAddress": METRICS,
    "ipam": {"bufferSize": sized(2, 8)},  # the churn empties it: ADDs served, then code 11
}
METRICS_SVC = ("svc", "create", f"{NS}/metrics", "--port", "81/TCP:9100", "--selector", "app=web")
METRICS_POLICY = web_policy("metrics", [{"ports": [{"port": 9100}]}])
PHASES = {  # phase -> (mark, mark)
    "member lost": ("member lost", "outage"),
    "outage": ("outage", "etcd back"),
    "return": ("etcd back", "end"),
}


def in_service_ips(node: ClusterNode, vip: str) -> bool:
    return bool(vip) and has_element(node.host.ns, 4, "service-ips", vip)


def vip_of(attempts: Attempts) -> str:
    return json.loads(attempts.stdout)["service"]["clusterIPs"][0] if attempts.stdout else ""


def lose_leader(drill: DrillCluster, churn: Churn) -> None:
    """The leader killed: the churn starts, a Service made now is programmed everywhere."""
    drill.etcd.leader().kill()
    drill.mark("member lost")
    churn.phase = "member lost"
    churn.start()
    loss = ("svc", "create", f"{NS}/loss", "--port", "82/TCP:8080", "--selector", "app=web")
    shown = ("svc", "show", f"{NS}/loss", "--output", "json")
    made = Attempts(drill.cluster.nodes[0], (*loss, "--output", "json"), landed=shown).start()
    made.wait()
    first_seen(drill.cluster.nodes, lambda n: in_service_ips(n, vip_of(made)))
    calls = len(churn.log)
    wait_for("the churn going on with a member lost", lambda: len(churn.log) >= calls + 6, 30)


def outage(drill: DrillCluster, churn: Churn) -> tuple[Attempts, Attempts]:
    """Every member stopped for OUTAGE s while the churn and the operator's attempts go on,
    then started again; returns the attempts (still running until accepted)."""
    for member in drill.etcd.members:
        member.stop()
    drill.mark("outage")
    churn.phase = "outage"
    n1 = drill.cluster.nodes[0]
    shown = ("svc", "show", f"{NS}/metrics", "--output", "json")
    svc = Attempts(n1, (*METRICS_SVC, "--output", "json"), landed=shown).start()
    pol = Attempts(n1, ("netpol", "apply", "-f", drill.manifest(METRICS_POLICY))).start()
    time.sleep(OUTAGE)  # the outage itself: what the drill is about, not a wait for a state
    drill.mark("return")
    for member in drill.etcd.members:
        member.start(wait=False)
    churn.stop()
    wait_for("etcd answering", lambda: any(m.healthy() for m in drill.etcd.members), 30, 0.02)
    drill.mark("etcd back")
    return svc, pol


def shows_port_9100(node: ClusterNode) -> bool:
    out = node.host.ns.run(["nft", "list", "table", "inet", TABLE], check=False).stdout
    return "9100" in out


def stored_at(drill: DrillCluster, key: str) -> float:
    """When (monotonic) etcd first held ``key``, read through its own HTTP gateway."""

    def held() -> bool:
        try:
            return key in drill.etcd.dump(key)
        except (RuntimeError, OSError):  # no member answers yet
            return False

    wait_for(f"{key} in etcd", held, 60, 0.05)
    return time.monotonic()


def watch_programmed(drill: DrillCluster, svc: Attempts, pol: Attempts) -> dict[str, dict]:
    """Per change: when its command returned, when etcd held it, and when each node's kernel
    first showed it (the policy: on the nodes of its Pods), all polled at once from etcd's
    return."""
    nodes = drill.cluster.nodes
    webs = [drill.pods[p].node for p in ("web-0", "web-1")]
    with ThreadPoolExecutor(4) as pool:
        svc_stored = pool.submit(stored_at, drill, f"{SERVICES}{NS}/metrics")
        pol_stored = pool.submit(stored_at, drill, netpol_key(NS, "metrics"))
        svc_seen = pool.submit(first_seen, nodes, lambda n: in_service_ips(n, vip_of(svc)))
        pol_seen = pool.submit(first_seen, webs, shows_port_9100)
        svc.wait(), pol.wait()
        return {
            "Service drill/metrics": {
                "returned": svc.accepted,
                "stored": svc_stored.result(),
                **svc_seen.result(),
            },
            "policy drill/metrics": {
                "returned": pol.accepted,
                "stored": pol_stored.result(),
                **pol_seen.result(),
            },
        }


def assert_refused_cleanly(attempts: Attempts, etcd_back: float) -> None:
    """Every refused attempt: exit 1, one message naming etcd, no traceback, before etcd was
    back (a refusal after that is no outage's)."""
    for attempt in attempts.refused():
        assert attempt.code == 1 and "etcd" in attempt.stderr, attempt
        assert "Traceback" not in attempt.stderr, attempt.stderr
        assert attempt.started < etcd_back, f"refused after etcd was back: {attempt}"


def assert_recovered(drill: DrillCluster, churn: Churn) -> list[Call]:
    """The failed DELs repeated, the journal written back, the failed ADDs retried, every
    address once and held as the Pods hold it; returns the live Pods' ADDs (the setup's and
    the churn's)."""
    churn.phase = "retry"
    repeated = churn.follow_failed_dels()  # the runtime repeats a teardown that failed
    assert all(c.ok for c in repeated), [c.run.stdout for c in repeated if not c.ok][:3]
    expected = {f"{NETWORK}/{c.cid}/eth0": sorted(c.ips()) for c in churn.live()}
    expected |= {f"{NETWORK}/{c.cid}/eth0": sorted(c.ips()) for c in drill.pod_calls()}
    wait_for(
        "the outage journal written back",
        lambda: store_view(drill.cluster.cluster).pod_handles(NETWORK) == expected,
        30,
        0.3,
    )
    retried = churn.retry_failed_adds()
    assert all(c.ok for c in retried), [c.run.stdout for c in retried if not c.ok][:3]
    live = churn.live() + drill.pod_calls()
    assert_no_duplicates(live)
    view = store_view(drill.cluster.cluster)
    assert_store_consistent(view)
    assert_handles_match(view, live, NETWORK)
    return live


def assert_changes_carry_traffic(drill: DrillCluster, svc: Attempts) -> None:
    client, denied, web1 = drill.pods["client"], drill.pods["denied"], drill.pods["web-1"]
    assert reaches(client.ns, vip_of(svc), 81), "the outage's Service carries no traffic"
    assert reaches(denied.ns, web1.ip, 9100), "the outage's policy is not in force"
    assert not reaches(denied.ns, web1.ip, 8080), "the denied pair let in"


def report(
    drill: DrillCluster, churn: Churn, changes: tuple[Attempts, ...], programmed: dict[str, dict]
) -> None:
    tried, survived = churn.pods(), churn.pods(ok=True)
    marks = drill.marks
    print(f"\netcd outage: {tried} tried, {survived} survived, {tried - survived} lost")
    print(f"  outage {marks['etcd back'] - marks['outage']:.1f}s; etcd answering "
          f"{marks['etcd back'] - marks['return']:.2f}s after its members started")  # fmt: skip
    for phase in ("member lost", "outage", "retry"):
        for command in ("ADD", "DEL"):
            done = [c for p, c in churn.log if p == phase and c.command == command]
            codes = sorted({c.code or 0 for c in done if not c.ok})
            print(f"  {phase}: {command} {sum(c.ok for c in done)}/{len(done)} ok, codes {codes}")
    for kind, phases in drill.windows(PHASES).items():
        if kind in DENIED:
            cells = [f"{p} {w.answered}/{w.tried} answered" for p, w in phases.items()]
        else:
            cells = [f"{p} {w.lost}/{w.tried} lost, {w.lost_per_second:.2f}/s"
                     for p, w in phases.items()]  # fmt: skip
        print(f"  {kind}: {'; '.join(cells)}")
    refused = ", ".join(f"`pycni {' '.join(a.argv[:2])}` {len(a.refused())}" for a in changes)
    print(f"  attempts refused during the outage (exit 1, naming etcd): {refused}")
    for what, times in programmed.items():
        after = {k: t - marks["etcd back"] for k, t in times.items()}
        nodes = {k: s for k, s in after.items() if k not in ("returned", "stored")}
        kernels = ", ".join(f"{k} +{s:.2f}s" for k, s in nodes.items())
        print(f"  {what}: in etcd +{after['stored']:.2f}s after its return (command returned "
              f"+{after['returned']:.2f}s); in the kernel of {kernels} "
              f"({max(nodes.values()) - after['stored']:.2f}s after etcd held it)")  # fmt: skip


def test_etcd_member_lost_then_whole_etcd_down_under_churn_and_changes(
    overlay_cluster, tmp_path
) -> None:
    cluster: OverlayCluster = overlay_cluster("vxlan", nodes=3, daemon=DAEMON, etcd_members=3)
    drill = DrillCluster(cluster, str(tmp_path))
    churn = Churn(cluster, CHURN_INTERVAL)
    try:
        drill.setup()
        lose_leader(drill, churn)
        svc, pol = outage(drill, churn)
        programmed = watch_programmed(drill, svc, pol)
        for attempts in (svc, pol):
            assert_refused_cleanly(attempts, drill.marks["etcd back"])
        failed = churn.failed()
        assert {c.code for c in failed} <= {11}, {c.code: c.run.stdout for c in failed}
        live = assert_recovered(drill, churn)
        drill.assert_reachable(live)
        assert_changes_carry_traffic(drill, svc)
        for node in cluster.nodes:
            config = f"{node.daemon.workdir}/pycnid.json"
            assert_doctor_clean(node.host.ns, config, networks=(NETWORK,))
        drill.mark("end")
    finally:
        churn.stop()
        drill.close()
    report(drill, churn, (svc, pol), programmed)
    drill.assert_traffic(PHASES)
    assert churn.pods(ok=True) == churn.pods()

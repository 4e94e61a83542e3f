"""The Service proxy on a 2-node vxlan cluster whose backend Pods are added through a conflist
(pycni-bridge then pycni-svc), so the endpoints are the plugin's: traffic spreads over backends
on both nodes and follows a DEL; a backend reaching its own Service is answered, masqueraded as
its bridge gateway; ClientIP affinity sticks, then expires after its timeout; a UDP client
moves to a live backend when its backend Pod is deleted. Waits are for the proxy to see a
store change, never timed assertions (the affinity timeout is the one time the test names)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass

import pytest

from tests.fixtures.waiting import wait_for

from .pods import OverlayCluster, Pod, python_in
from .svc_helpers import UDP_FLOW, ConflistPods, SvcPod
from .test_services import cli, connects, route_service_cidr
from .test_services_affinity import is_stuck

pytestmark = pytest.mark.etcd
AFFINITY = 2  # seconds: short, so expiry is seen in a few idle periods


@dataclass
class Shop:
    cluster: OverlayCluster
    pods: ConflistPods
    backends: list[SvcPod]  # the live app=web Pods (a test that deletes one removes it)
    clients: list[SvcPod]  # one per node: each exercises its own node's proxy
    vip: str  # shop/web's ClusterIP

    def live(self) -> set[str]:
        return {p.ip for p in self.backends}


@pytest.fixture(scope="module")
def shop(module_overlay):
    """Three app=web backends (web-0 on node 1, two on node 2), a client on each node, all
    through the conflist, and the Service shop/web selecting app=web."""
    cluster = module_overlay("vxlan", nodes=2, daemon={"services": {"proxy": True}})
    n1, n2 = cluster.nodes
    pods = ConflistPods(cluster)
    try:
        backends = [
            pods.add(node, "shop", f"web-{i}", {"app": "web", "pod": f"web-{i}"})
            for i, node in enumerate((n1, n2, n2))
        ]
        clients = [
            pods.add(node, "shop", f"client-{i}", {"app": "client"}, serve=False)
            for i, node in enumerate((n1, n2))
        ]
        for node in cluster.nodes:
            route_service_cidr(cluster, node)
        cli(cluster, "config", "set", "--cidr", "10.96.0.0/24")
        web = cli(cluster, "create", "shop/web", "--port", "80/TCP:8080", "--selector", "app=web")[
            "service"
        ]
        yield Shop(cluster, pods, backends, clients, web["clusterIPs"][0])
    finally:
        pods.close()


def who(pod: Pod, vip: str, port: int, count: int) -> list[tuple[str, str]]:
    """``count`` connects: (backend address, the source it saw) each, or (error name, "")."""
    return [(*answer.split(",", 1), "")[:2] for answer in connects(pod.ns, vip, port, count)]


def backends_of(answers: list[tuple[str, str]]) -> set[str]:
    return {local for local, _ in answers}


def wait_backends(pod: Pod, vip: str, port: int, want: set[str]) -> None:
    """Until 10 connects are answered by exactly ``want`` (this node's proxy saw the change)."""
    wait_for(
        f"{vip}:{port} from {pod.ip} answered by {want}",
        lambda: backends_of(who(pod, vip, port, 10)) == want,
        timeout=20,
        step=0.2,
    )


def test_endpoints_from_pycni_svc_spread_traffic_and_a_del_withdraws_one(shop):
    for client in shop.clients:
        wait_backends(client, shop.vip, 80, shop.live())
    seen = Counter(local for local, _ in who(shop.clients[0], shop.vip, 80, 300))
    assert set(seen) == shop.live() and all(n >= 60 for n in seen.values()), seen  # >= 20%
    listed = cli(shop.cluster, "endpoints", "shop/web")["endpoints"]
    assert sorted((e["pod"], e["ips"], e["node"]) for e in listed) == sorted(
        (p.name, [p.ip], p.node.name) for p in shop.backends
    )

    gone = shop.backends.pop()  # web-2, on node 2
    shop.pods.delete(gone)
    listed = cli(shop.cluster, "endpoints", "shop/web")["endpoints"]
    assert {e["pod"] for e in listed} == {p.name for p in shop.backends}
    for client in shop.clients:  # the proxy on both nodes follows the withdrawal
        wait_backends(client, shop.vip, 80, shop.live())
    assert gone.ip not in backends_of(who(shop.clients[1], shop.vip, 80, 60))


def test_a_backend_reaching_its_own_service_is_answered_masqueraded(shop):
    me = shop.backends[0]  # web-0, the only backend on node 1
    gateway = me.result["ips"][0]["gateway"]
    answers = wait_for(
        "web-0 answered through shop/web by every backend",
        lambda: (got := who(me, shop.vip, 80, 40)) and backends_of(got) == shop.live() and got,
        timeout=20,
        step=0.2,
    )
    assert {(local, peer) for local, peer in answers} == {
        (p.ip, gateway if p is me else me.ip) for p in shop.backends
    }  # Pod to Pod keeps its IP

    vip = cli(
        shop.cluster, "create", "shop/self", "--port", "80/TCP:8080", "--selector", "pod=web-0"
    )["service"]["clusterIPs"][0]
    try:
        wait_backends(me, vip, 80, {me.ip})  # it must hairpin: it is the only endpoint
        assert set(who(me, vip, 80, 10)) == {(me.ip, gateway)}
    finally:
        cli(shop.cluster, "rm", "shop/self")


def test_client_ip_affinity_sticks_and_expires_after_its_timeout(shop):
    client, live = shop.clients[0], shop.live()
    vip = cli(
        shop.cluster,
        "create",
        "shop/sticky",
        "--port",
        "80/TCP:8080",
        "--selector",
        "app=web",
        "--session-affinity",
        "ClientIP",
        "--affinity-timeout",
        str(AFFINITY),
    )["service"]["clusterIPs"][0]
    try:
        wait_for(
            "shop/sticky answering",
            lambda: backends_of(who(client, vip, 80, 1)) <= live,
            timeout=20,
            step=0.2,
        )
        stuck = backends_of(who(client, vip, 80, 30))
        assert len(stuck) == 1 and stuck <= live, stuck
        seen = stuck
        node1 = client.node.host.ns
        for _ in range(16):  # each idle period re-picks at random: 2**-16 to miss with 2
            wait_for(  # the kernel drops the client's element after the timeout: no margin
                "shop/sticky's affinity to expire",
                lambda: not is_stuck(node1, 4, client.ip),
                AFFINITY + 10,
                0.2,
            )
            seen = backends_of(who(client, vip, 80, 1))
            if seen != stuck:
                break
        assert seen <= live - stuck and seen, (stuck, seen)
    finally:
        cli(shop.cluster, "rm", "shop/sticky")


def last_answer(path: str) -> str:
    with open(path) as fh:
        lines = fh.read().split()
    return lines[-1] if lines else ""


def test_a_udp_client_moves_to_a_live_backend_when_its_backend_pod_is_deleted(shop):
    """One socket, one source port, sending all along: its conntrack entry still points at
    the deleted Pod until the proxy deletes it after the sync; then it reaches a live one."""
    client = shop.clients[0]
    vip = cli(
        shop.cluster, "create", "shop/dns", "--port", "53/UDP:5353", "--selector", "app=web"
    )["service"]["clusterIPs"][0]
    work = tempfile.mkdtemp(prefix="udpflow")
    log, stop = os.path.join(work, "log"), os.path.join(work, "stop")
    with open(log, "w") as out:
        flow = subprocess.Popen(python_in(client.ns, UDP_FLOW) + [vip, "53", stop], stdout=out)
    try:
        talking = wait_for(
            "the UDP client answered by a backend",
            lambda: (answer := last_answer(log)) in shop.live() and answer,
            timeout=20,
            step=0.2,
        )
        pod = next(p for p in shop.backends if p.ip == talking)
        shop.backends.remove(pod)
        shop.pods.delete(pod)
        wait_for(
            "the same socket answered by a live backend",
            lambda: last_answer(log) in shop.live(),
            timeout=20,
            step=0.2,
        )
    finally:
        open(stop, "w").close()
        flow.wait(timeout=10)
        cli(shop.cluster, "rm", "shop/dns")

"""ClientIP affinity is per Service port, as Kubernetes keys it, on a 2-node dual-stack vxlan
cluster with the proxy in every pycnid: a client Pod on node1 that reached backend X through
the ClusterIP reaches X through the NodePort (on node1's address) and an externalIP of the same
port, IPv4 and IPv6, until the affinity's timeout expires (its entry, the endpoint's key and
the client, leaves the ``clients`` set; the next connection picks afresh). Three backends (one
on node1, two on node2): with an entry-point-keyed sticky state each other entry would hit X
only by chance (1 in 3), so two rounds pass by chance once in 6,561 runs. Waits are for the
proxy to follow a store change or for the kernel's timeout, never timed assertions. `pycni
doctor` finds every object of the proxy's tables explained (affinity chains, the clients set,
slot maps)."""

from __future__ import annotations

import os
import subprocess

import pytest

from services.record import EndpointRecord
from tests.fixtures.bridge import ip_of
from tests.fixtures.doctor import assert_doctor_clean
from tests.fixtures.echo import PEER_SERVER
from tests.fixtures.svc_kernel import calc_stuck_clients
from tests.fixtures.waiting import wait_for

from .pods import NETWORK, python_in
from .svc_policy_helpers import backends_of, connect, route_service_cidrs, svc
from .test_services_policy import dual_stack_conf

pytestmark = pytest.mark.etcd
CIDRS = ("10.96.0.0/24", "fd00:96::/112")
EXTERNAL = {4: "203.0.113.90", 6: "2001:db8:90::90"}
NODE1_V6 = "fd77::1"  # a global IPv6 address of node1: its IPv6 NodePort address
TIMEOUT = 3  # the Service's affinity timeout, seconds
ROUNDS = 2


@pytest.fixture(scope="module")
def sticky(module_overlay):
    """The cluster, backends b0 (node1), b1 and b2 (node2), a client Pod on node1 and the
    Service ns/sticky (NodePort, both families' externalIPs, ClientIP affinity)."""
    cluster = module_overlay("vxlan", nodes=2, daemon={"services": {"proxy": True}})
    cluster.add_pool("pods6", "fd31::/112", 122)
    cluster.wait_vteps(lambda overlay: len(overlay["vteps"]) == 2)
    n1, n2 = cluster.nodes
    n1.host.ns.run(["ip", "-6", "addr", "add", f"{NODE1_V6}/128", "dev", "eth0", "nodad"])
    backends = [cluster.add_pod(n, dual_stack_conf()) for n in (n1, n2, n2)]
    client = cluster.add_pod(n1, dual_stack_conf())
    servers = [subprocess.Popen(python_in(p.ns, PEER_SERVER)) for p in backends]
    for i, pod in enumerate(backends):
        ep = EndpointRecord(
            "ns", f"b{i}", "eth0", (pod.ip, ip_of(pod.result, 1)), {"app": "aff"}, pod.node.name
        )
        cluster.cluster.etcd.put(ep.key, ep.to_bytes())
    for node in cluster.nodes:
        route_service_cidrs(node.host.ns, CIDRS)
    svc(cluster, "config", "set", *[a for c in CIDRS for a in ("--cidr", c)])
    service = svc(
        cluster,
        "create",
        "ns/sticky",
        "--type",
        "NodePort",
        "--port",
        "80/TCP:8080",
        "--selector",
        "app=aff",
        "--session-affinity",
        "ClientIP",
        "--affinity-timeout",
        str(TIMEOUT),
        *[a for ip in EXTERNAL.values() for a in ("--external-ip", ip)],
    )["service"]
    yield cluster, backends, client, service
    for server in servers:
        server.kill()
        server.wait()


def entry_points(cluster, service: dict, family: int) -> dict[str, tuple[str, int]]:
    """The ClusterIP, the NodePort on node1 and the externalIP of ``family``."""
    vip = next(ip for ip in service["clusterIPs"] if (":" in ip) == (family == 6))
    node1 = NODE1_V6 if family == 6 else cluster.records()[cluster.nodes[0].name]["address"]
    return {
        "ClusterIP": (vip, 80),
        "NodePort": (node1, service["ports"][0]["nodePort"]),
        "externalIP": (EXTERNAL[family], 80),
    }


def is_stuck(ns, family: int, client: str) -> bool:
    """Whether node1's ``clients`` set holds ``client`` under some endpoint's key."""
    return client in calc_stuck_clients(ns.run, family)


@pytest.mark.parametrize("family", [4, 6])
def test_a_client_keeps_its_backend_across_clusterip_nodeport_and_external_ip(sticky, family):
    cluster, backends, client, service = sticky
    n1 = cluster.nodes[0]
    src = client.ip if family == 4 else ip_of(client.result, 1)
    mine = {p.ip if family == 4 else ip_of(p.result, 1) for p in backends}
    entries = entry_points(cluster, service, family)
    for name, (ip, port) in entries.items():  # the proxy holds every entry point
        wait_for(
            f"{name} {ip}:{port} answering",
            lambda ip=ip, port=port: backends_of(connect(client.ns, ip, port, 1)) <= mine,
            20,
            0.2,
        )
    chosen = set()
    for _round in range(ROUNDS):
        wait_for(
            "the client's affinity expired",
            lambda: not is_stuck(n1.host.ns, family, src),
            TIMEOUT + 10,
            0.2,
        )
        vip, port = entries["ClusterIP"]
        (first,) = backends_of(connect(client.ns, vip, port, 1))
        assert first in mine and is_stuck(n1.host.ns, family, src)
        for name, (ip, port) in [*entries.items(), ("ClusterIP", entries["ClusterIP"])]:
            answered = backends_of(connect(client.ns, ip, port, 3))
            assert answered == {first}, (name, first, answered)
        chosen.add(first)
    assert chosen <= mine
    if family == 6:  # both families' tables, with affinity chains, sets and slot maps
        config = os.path.join(n1.daemon.workdir, "pycnid.json")
        assert_doctor_clean(n1.host.ns, config, networks=(NETWORK,))

"""Drill: records that do not decode, or that lie, written under every prefix a node's syncs read.

Two nodes with the VXLAN overlay, the Service proxy and NetworkPolicy on; a Pod on each. Into
etcd go, as another node or a hand-edit could write them: node records with a bad underlay,
a bad VTEP MAC, garbage bytes, a list; a block of a pool that does not exist naming a node
that does not exist; a Service, an endpoint, a policy and a namespace record that do not
decode. All at once (`make drills`: each alone first, put then removed, then all at once)
while the nodes keep working. A hostile record survives when this node's syncs skip it and
go on: the Pods still reach each other across the overlay, a Service and a policy changed
afterwards are still programmed on both nodes, each node logs the key once (per consumer that
reads it) and counts it in ``pycni_records_skipped{consumer}``, back at 0 once the key is gone.
Prints "N tried, N survived, 0 lost".
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from netpol.policy import parse_policy
from netpol.render import TABLE
from services.record import EndpointRecord
from store.codec import encode
from store.keys import BLOCKS, ENDPOINTS, NAMESPACES, NETPOLS, NODES, SERVICES, netpol_key
from tests.fixtures.cluster import b64
from tests.fixtures.scale import sized
from tests.fixtures.waiting import wait_for

from .pods import METRICS, OverlayCluster, pycni_cli, scrape

pytestmark = [
    pytest.mark.netns,
    pytest.mark.etcd,
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.drill,
]

#: consumer -> the prefixes it reads (a key under one of them is skipped by that consumer)
READERS = {
    "overlay": (NODES, BLOCKS),
    "proxy": (SERVICES, ENDPOINTS, NODES),
    "netpol": (NETPOLS, NAMESPACES, ENDPOINTS, NODES),
}


def hostile_records(real_node: dict) -> dict[str, bytes]:
    def node(name: str, **overlay: object) -> bytes:
        info = {**real_node["overlay"], **overlay}
        return json.dumps({**real_node, "name": name, "overlay": info}).encode()

    return {
        f"{NODES}evil-underlay": node("evil-underlay", underlay="999.1.1.1"),
        f"{NODES}evil-mac": node("evil-mac", vtepMAC="zz:zz:zz:zz:zz:zz"),
        f"{NODES}evil-bytes": b"\xff\xfe{",
        f"{NODES}evil-list": b"[1, 2]",
        f"{BLOCKS}nosuch/10.250.0.0-26": b'{"node": 7, "allocations": "x"}',
        f"{SERVICES}drill/evil": b"not json",
        f"{ENDPOINTS}drill/evil/eth0": b'{"ips": 5}',
        f"{NETPOLS}drill/evil": b'{"spec": {"podSelector": 5}}',
        f"{NAMESPACES}evil": b'{"labels": [1]}',
    }


def readers_of(key: str) -> list[str]:
    return [c for c, prefixes in READERS.items() if key.startswith(prefixes)]


def skipped(node) -> dict[str, float]:
    metrics = scrape(node)
    return {c: metrics.get(f'pycni_records_skipped{{consumer="{c}"}}', 0.0) for c in READERS}


def wait_counted(node, expect: dict[str, float], what: str) -> None:
    try:
        wait_for(what, lambda: skipped(node) == expect)
    except AssertionError:
        lines = [ln for ln in node.daemon.log().splitlines() if "ignoring" in ln]
        raise AssertionError(
            f"{what}: counted {skipped(node)}; the log's last: {lines[-6:]}"
        ) from None


def ignored_lines(node, key: str) -> int:
    return len(re.findall(rf": ignoring {re.escape(key)}:", node.daemon.log()))


def ping(cluster: OverlayCluster, src, dst) -> bool:
    out = subprocess.run(
        ["ip", "netns", "exec", src.ns.name, "ping", "-c1", "-W2", dst.ip],
        capture_output=True,
        timeout=10,
    )
    return out.returncode == 0


def set_policy(cluster: OverlayCluster, port: int) -> str:
    """A policy on the drill's Pods: anything from each other (the ping), and TCP ``port``
    from anywhere (the element that says this version is programmed)."""
    manifest = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": "drill", "name": "web"},
        "spec": {
            "podSelector": {},
            "ingress": [
                {"from": [{"podSelector": {}}]},
                {"ports": [{"port": port}]},
            ],
        },
    }
    policy = parse_policy(manifest)
    cluster.cluster.etcd.put(netpol_key("drill", "web"), encode(policy.to_dict()))
    return str(port)


def programmed(cluster: OverlayCluster, port: str, service_port: str) -> bool:
    for node in cluster.nodes:
        table = node.host.ns.run(["nft", "list", "table", "inet", TABLE], check=False).stdout
        svc = node.host.ns.run(["nft", "list", "ruleset"], check=False).stdout
        if f"dport {port}" not in table.replace(". ", "") and f". {port} " not in table:
            return False
        if f" {service_port} " not in svc:
            return False
    return True


def test_hostile_records_are_skipped_and_every_node_keeps_working(overlay_cluster) -> None:
    cluster = overlay_cluster(
        "vxlan",
        nodes=2,
        daemon={
            "services": {"proxy": True},
            "networkPolicy": {"enforce": True},
            "metricsAddress": METRICS,
        },
    )
    n1, n2 = cluster.nodes
    pods = [cluster.add_pod(n1), cluster.add_pod(n2)]
    for i, pod in enumerate(pods):
        ep = EndpointRecord("drill", f"p{i}", "eth0", (pod.ip,), {"app": "web"}, pod.node.name)
        cluster.cluster.etcd.put(ep.key, ep.to_bytes())
    config = ("config", "set", "--cidr", "10.96.0.0/24", "--node-port-range", "30000-30100")
    assert pycni_cli(n1, "svc", *config).returncode == 0
    real_node = cluster.records()[n1.name]
    hostile = hostile_records(real_node)
    tried = survived = 0
    etcd = cluster.cluster.etcd
    rounds = sized([list(hostile)], [*([k] for k in hostile), list(hostile)])
    puts = dict.fromkeys(hostile, 0)
    for round_, batch in enumerate(rounds):
        for key in batch:
            etcd.put(key, hostile[key])
            puts[key] += 1
        tried += len(batch)
        port = set_policy(cluster, 8000 + round_)
        svc_port = str(9000 + round_)
        made = pycni_cli(
            n1, "svc", "create", f"drill/s{round_}", "--port", f"{svc_port}/TCP:80",
            "--selector", "app=web",
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        wait_for(f"round {round_}: the policy and Service on both nodes",
                 lambda p=port, s=svc_port: programmed(cluster, p, s), 20)  # fmt: skip
        assert ping(cluster, pods[0], pods[1]) and ping(cluster, pods[1], pods[0])
        for node in cluster.nodes:
            expect = {c: sum(1 for k in batch if c in readers_of(k)) for c in READERS}
            wait_counted(node, expect, f"{node.name} to count {expect}")
            for key in batch:  # once per consumer each time it was put
                assert ignored_lines(node, key) == len(readers_of(key)) * puts[key], key
        for key in batch:
            etcd.call("/v3/kv/deleterange", {"key": b64(key)})
        for node in cluster.nodes:
            zero = dict.fromkeys(READERS, 0.0)
            wait_counted(node, zero, f"{node.name}'s skipped records back to 0")
        survived += len(batch)
    print(f"\nhostile records drill: {tried} tried, {survived} survived, {tried - survived} lost")
    assert survived == tried == sum(puts.values())

"""Synthetic NetworkPolicy records for `make bench-netpol`, the same in every store and run.

    python3 -m bench.netpol_records --write ENDPOINTS POLICIES PODS LOCAL NODE
        (inside a node namespace: every record into etcd through the store's txn)

A cluster of ``pods`` Pods in 100 namespaces ``ns<i>`` (labels ``team: t<i % 10>``, ``env:
prod|dev``), spread over ``pods // local`` nodes: Pod ``j`` is in ``ns<j % 100>``, on the
measured ``node`` when ``j // 7 % nodes == 0`` (~``local`` of them), else on ``n<that>``,
labels ``app: a<j // 100 % 50>``, ``tier: web|api|db``, named ports ``http`` (TCP 8080),
``metrics`` (TCP 9090) and ``dns`` (UDP 53). Policy ``k`` is in ``ns<k % 100>`` and selects
``app: a<k // 100 % 50>`` there; four kinds in turn (``calc_policy``): ingress from a
podSelector on a numeric port; ingress from a namespaceSelector AND podSelector on a named
port; egress to an ipBlock with an ``except`` on 443 and to a namespaceSelector on UDP 53;
both directions, a ``matchExpressions`` namespaceSelector on a port range and a tier on a
named port. A few "spare" Pods in namespace ``spare`` on the measured node are selected by no
policy: the policy changes of the cross-node figure isolate them one by one.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from netpol.policy import NetworkPolicy, parse_policy
from netpol.record import NamespaceRecord, encode_policy
from services.record import EndpointRecord
from store.base import Put, Store
from store.keys import namespace_key, netpol_key

NAMESPACES = 100
APPS = 50
TIERS = ("web", "api", "db")
NAMED_PORTS = {"http": 8080, "metrics": 9090, "dns": 53}
PORT_PROTOCOLS = {"dns": "UDP"}
SPARE_NS = "spare"
PER_TXN = 120  # etcd takes at most 128 operations a txn


@dataclass(frozen=True)
class Sizes:
    policies: int
    pods: int
    local: int
    node: str  # the measured node's name

    @property
    def nodes(self) -> int:
        return max(1, self.pods // max(1, self.local))


def pod_ip(j: int, base: int = 128) -> str:
    return f"10.{base + j // 65536}.{j // 256 % 256}.{j % 256}"


def node_of(sizes: Sizes, j: int) -> str:
    rest = j // 7 % sizes.nodes  # runs of 7: a node's Pods spread over the namespaces
    return sizes.node if rest == 0 else f"n{rest}"


def calc_pod(sizes: Sizes, j: int, labels: dict[str, str] | None = None) -> EndpointRecord:
    return EndpointRecord(
        f"ns{j % NAMESPACES}",
        f"p{j}",
        "eth0",
        (pod_ip(j),),
        labels or calc_labels(j),
        node_of(sizes, j),
        dict(NAMED_PORTS),
        port_protocols=dict(PORT_PROTOCOLS),
    )


def calc_labels(j: int) -> dict[str, str]:
    return {"app": f"a{j // NAMESPACES % APPS}", "tier": TIERS[j % len(TIERS)]}


def calc_spare(sizes: Sizes, r: int) -> EndpointRecord:
    """Spare Pod ``r`` on the measured node (10.127.x.y), selected by no generated policy."""
    ip = pod_ip(r, base=127)
    return EndpointRecord(SPARE_NS, f"spare{r}", "eth0", (ip,), {"spare": f"s{r}"}, sizes.node)


def calc_namespace(i: int) -> NamespaceRecord:
    return NamespaceRecord(f"ns{i}", {"team": f"t{i % 10}", "env": ("prod", "dev")[i % 2]})


def manifest(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": namespace, "name": name},
        "spec": spec,
    }


def calc_policy(k: int) -> NetworkPolicy:
    """Policy ``k``: one of four kinds (see the module docstring)."""
    selector = {"matchLabels": {"app": f"a{k // NAMESPACES % APPS}"}}
    spec = {"podSelector": selector, **KINDS[k % len(KINDS)](k)}
    return parse_policy(manifest(f"ns{k % NAMESPACES}", f"np{k}", spec))


def _ingress_pods(k: int) -> dict[str, Any]:
    peer = {"podSelector": {"matchLabels": {"tier": "web"}}}
    return {"ingress": [{"from": [peer], "ports": [{"protocol": "TCP", "port": 8080}]}]}


def _ingress_team(k: int) -> dict[str, Any]:
    peer = {
        "namespaceSelector": {"matchLabels": {"team": f"t{k % 10}"}},
        "podSelector": {"matchLabels": {"tier": "api"}},
    }
    return {"ingress": [{"from": [peer], "ports": [{"port": "http"}]}]}


def _egress_blocks(k: int) -> dict[str, Any]:
    block = {"ipBlock": {"cidr": "172.16.0.0/12", "except": [f"172.16.{k % 250}.0/24"]}}
    dns = {"namespaceSelector": {"matchLabels": {"env": "prod"}}}
    return {
        "policyTypes": ["Egress"],
        "egress": [
            {"to": [block], "ports": [{"protocol": "TCP", "port": 443}]},
            {"to": [dns], "ports": [{"protocol": "UDP", "port": 53}]},
        ],
    }


def _both(k: int) -> dict[str, Any]:
    env = {"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]}
    port_range = {"protocol": "TCP", "port": 8000, "endPort": 8100}
    db = {"podSelector": {"matchLabels": {"tier": "db"}}}
    return {
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": [{"namespaceSelector": env}], "ports": [port_range]}],
        "egress": [{"to": [db], "ports": [{"port": "metrics"}]}],
    }


KINDS = (_ingress_pods, _ingress_team, _egress_blocks, _both)


def calc_spare_policy(r: int, selects: bool) -> NetworkPolicy:
    """The change of the cross-node figure: ``bench-change<r>`` in namespace spare, selecting
    spare Pod ``r`` once ``selects`` (before: a label no Pod has), ingress on TCP 4000 + r."""
    value = f"s{r}" if selects else f"none{r}"
    spec = {
        "podSelector": {"matchLabels": {"spare": value}},
        "ingress": [{"ports": [{"protocol": "TCP", "port": 4000 + r}]}],
    }
    return parse_policy(manifest(SPARE_NS, f"bench-change{r}", spec))


def iter_records(sizes: Sizes, spares: int = 0) -> Iterator[tuple[str, bytes]]:
    """Every record: namespaces, Pods (and spares), policies (and unselecting spare ones)."""
    for i in range(NAMESPACES):
        record = calc_namespace(i)
        yield namespace_key(record.name), record.to_bytes()
    for j in range(sizes.pods):
        pod = calc_pod(sizes, j)
        yield pod.key, pod.to_bytes()
    for r in range(spares):
        spare = calc_spare(sizes, r)
        yield spare.key, spare.to_bytes()
    for k in range(sizes.policies):
        yield policy_kv(calc_policy(k))
    for r in range(spares):
        yield policy_kv(calc_spare_policy(r, selects=False))


def policy_kv(policy: NetworkPolicy) -> tuple[str, bytes]:
    return netpol_key(policy.namespace, policy.name), encode_policy(policy)


def write_records(store: Store, records: Iterator[tuple[str, bytes]]) -> int:
    """Every record through ``store.txn``, PER_TXN a txn; how many."""
    batch: list[Put] = []
    written = 0
    for key, value in records:
        batch.append(Put(key, value))
        if len(batch) == PER_TXN:
            written += flush(store, batch)
    return written + flush(store, batch)


def flush(store: Store, batch: list[Put]) -> int:
    if batch:
        assert store.txn([], batch).succeeded
    count = len(batch)
    batch.clear()
    return count


def main(argv: list[str]) -> int:
    """``--write ENDPOINTS POLICIES PODS LOCAL NODE SPARES``: prints (seconds, records)."""
    if argv[:1] != ["--write"] or len(argv) != 7:
        sys.exit("usage: python -m bench.netpol_records --write ENDPOINTS P N LOCAL NODE SPARES")
    from store.etcd import EtcdStore

    sizes = Sizes(int(argv[2]), int(argv[3]), int(argv[4]), argv[5])
    store = EtcdStore(argv[1].split(","))
    started = time.monotonic()
    written = write_records(store, iter_records(sizes, int(argv[6])))
    print(json.dumps([time.monotonic() - started, written]), flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

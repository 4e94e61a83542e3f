"""Pool exhaustion on two nodes sharing one small pool: every usable address is handed out
exactly once, then ADD fails with a precise error naming the pool and the node, and a failed
dual-stack ADD writes nothing (the IPv6 side, which has room, is not half-leased).

Two pool kinds: a netconf range (host-local semantics) and named cluster pools written to
etcd as an operator would (exclusions and a gateway per block never handed out)."""

from __future__ import annotations

import ipaddress
import json
import time
from dataclasses import dataclass

import pytest

from .checks import (
    assert_cli_checks_clean,
    assert_handles_match,
    assert_no_duplicates,
    assert_only_buffers_left,
    assert_store_consistent,
    cli_check,
    store_view,
)
from .invariants import StoreView
from .load import NETWORK, ipam, netconf

pytestmark = [pytest.mark.netns, pytest.mark.etcd]


@dataclass(frozen=True)
class Case:
    v4: str
    usable: int  # addresses of the v4 pool that can ever be handed out
    never: tuple[str, ...]  # v4 addresses that must never be handed out
    pools: tuple[dict, ...] = ()  # cluster pool records to write first

    def conf(self) -> dict:
        if self.pools:
            return {
                "cniVersion": "1.1.0",
                "name": NETWORK,
                "type": "ptp",
                "ipam": {"type": "pycni-ipam", "pools": [p["name"] for p in self.pools]},
            }
        return netconf(
            [[{"subnet": self.v4, "blockSize": 28}], [{"subnet": "fd97::/120", "blockSize": 124}]]
        )


def pool_record(name: str, cidr: str, block: int, **keys) -> dict:
    return {
        "name": name,
        "cidr": cidr,
        "blockSize": block,
        "disabled": False,
        "nodeSelector": {},
        "strictAffinity": False,
        "exclusions": [],
        "gateway": "none",
        "reuseDelay": 120,
        "createdAt": time.time(),
        **keys,
    }


CASES = {
    # .0 network, .1 the range's gateway, .31 broadcast: 29 usable (.2-.30)
    "netconf-range": Case("10.97.0.0/27", 29, ("10.97.0.0", "10.97.0.1", "10.97.0.31")),
    # 32 - network/broadcast - 3 excluded - a gateway per /28 block (.1 and .16) = 25
    "cluster-pools": Case(
        "10.98.0.0/27",
        25,
        (
            "10.98.0.0",
            "10.98.0.1",
            "10.98.0.16",
            "10.98.0.20",
            "10.98.0.21",
            "10.98.0.22",
            "10.98.0.31",
        ),
        (
            pool_record(
                "small4", "10.98.0.0/27", 28, gateway="first", exclusions=["10.98.0.20-10.98.0.22"]
            ),
            pool_record("big6", "fd98::/120", 124),
        ),
    ),
}


def pod_state(view: StoreView) -> tuple[dict, dict]:
    """What a failed ADD must not change: pod handles and non-buffer allocations."""
    allocs = {ip: h for ip, h in view.allocations().items() if not h.startswith("_buffer/")}
    return view.pod_handles(NETWORK), allocs


def buffered(view: StoreView, subnet: str) -> int:
    net = ipaddress.ip_network(subnet)
    return sum(
        1
        for ip, h in view.allocations().items()
        if h.startswith("_buffer/") and ipaddress.ip_address(ip) in net
    )


def pool_name_of(dump: dict, subnet: str) -> str:
    """The name of the pool record whose cidr is ``subnet`` (as the store has it)."""
    for key, (value, _) in dump.items():
        if key.startswith("/pycni/v1/pools/"):
            record = json.loads(value)
            if str(ipaddress.ip_network(record.get("cidr", "0.0.0.0/32"))) == subnet:
                return record.get("name") or key.rsplit("/", 1)[1]
    raise AssertionError(f"no pool record with cidr {subnet}")


def fill_pool(cni_bin, cluster, conf: dict, limit: int) -> list:
    """ADD on the nodes in turn until a whole round gets no address."""
    adds, serial = [], 0
    while True:
        round_ok = False
        for node in cluster.nodes:
            serial += 1
            call = ipam(cni_bin, node, "ADD", conf, f"{node.name}-p{serial}")
            if call.ok:
                adds.append(call)
                round_ok = True
            else:
                assert call.code == 101, call.run.stdout
        if not round_ok:
            return adds
        assert len(adds) <= limit, "more ADDs succeeded than the pool has addresses"


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_exhausted_pool_precise_error_nothing_half_written(make_cluster, cni_bin, case):
    cluster = make_cluster(nodes=2, etcd_members=1)
    for record in case.pools:
        cluster.etcd.put(f"/pycni/v1/pools/{record['name']}", json.dumps(record).encode())
    conf = case.conf()
    adds = fill_pool(cni_bin, cluster, conf, case.usable)

    dump = cluster.etcd.dump()
    view = StoreView.parse(dump)
    assert_store_consistent(view)
    assert_handles_match(view, adds)
    assert_no_duplicates(adds)
    v4 = [ip for c in adds for ip in c.ips() if ":" not in ip]
    assert all(ipaddress.ip_address(ip) in ipaddress.ip_network(case.v4) for ip in v4)
    assert not set(v4) & set(case.never), f"handed out: {sorted(set(v4) & set(case.never))}"
    assert len(v4) + buffered(view, case.v4) == case.usable, "usable addresses left unused"

    pool = pool_name_of(dump, case.v4)
    before = pod_state(view)
    for node in cluster.nodes:
        failed = ipam(cni_bin, node, "ADD", conf, f"{node.name}-late")
        err = failed.run.json
        assert failed.code == 101, failed.run.stdout
        assert pool in err["msg"] and node.name in err["msg"], (
            f"expected 'no address left in pool {pool} for node {node.name}', got {err}"
        )
    assert pod_state(store_view(cluster)) == before, "a failed ADD wrote an allocation"
    checks = [cli_check(cluster, "with the pool exhausted")]

    freed = adds.pop(0)
    node = next(n for n in cluster.nodes if n.name == freed.node)
    assert ipam(cni_bin, node, "DEL", conf, freed.cid).ok
    reuse = ipam(cni_bin, node, "ADD", conf, f"{node.name}-reuse")
    assert reuse.ok, reuse.run.stdout  # in its reuse delay, but nothing else is free
    assert [ip for ip in reuse.ips() if ":" not in ip] == [
        ip for ip in freed.ips() if ":" not in ip
    ]
    for call in adds + [reuse]:
        node = next(n for n in cluster.nodes if n.name == call.node)
        assert ipam(cni_bin, node, "DEL", conf, call.cid).ok
    view = store_view(cluster)
    assert_store_consistent(view)
    assert_only_buffers_left(view, NETWORK)
    checks.append(cli_check(cluster, "after DEL of every attachment"))
    assert_cli_checks_clean(checks)

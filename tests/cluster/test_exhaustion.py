"""Pool exhaustion on two nodes sharing one small pool: every usable address is handed out
exactly once, then ADD fails with a precise error naming the pool and the node, and a failed
dual-stack ADD writes nothing (the IPv6 side, which has room, is not half-leased)."""
from __future__ import annotations

import ipaddress
import json

import pytest

from .checks import (assert_cli_checks_clean, assert_handles_match, assert_no_duplicates,
                     assert_only_buffers_left, assert_store_consistent, cli_check, store_view)
from .invariants import StoreView
from .load import NETWORK, ipam, netconf

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

V4 = "10.97.0.0/27"  # .0 network, .1 gateway, .31 broadcast: 29 usable (.2-.30)
V6 = "fd97::/120"
USABLE_V4 = 29


def pod_state(view: StoreView) -> tuple[dict, dict]:
    """What a failed ADD must not change: pod handles and non-buffer allocations."""
    allocs = {ip: h for ip, h in view.allocations().items() if not h.startswith("_buffer/")}
    return view.pod_handles(NETWORK), allocs


def buffered(view: StoreView, subnet: str) -> int:
    net = ipaddress.ip_network(subnet)
    return sum(1 for ip, h in view.allocations().items()
               if h.startswith("_buffer/") and ipaddress.ip_address(ip) in net)


def pool_name_of(view_dump: dict, subnet: str) -> str:
    """The pool record's name whose cidr is ``subnet`` (as the store has it)."""
    for key, (value, _) in view_dump.items():
        if key.startswith("/pycni/v1/pools/"):
            record = json.loads(value)
            if str(ipaddress.ip_network(record.get("cidr", "0.0.0.0/32"))) == subnet:
                return record.get("name") or key.rsplit("/", 1)[1]
    raise AssertionError(f"no pool record with cidr {subnet}")


def test_exhausted_pool_precise_error_nothing_half_written(make_cluster, cni_bin):
    cluster = make_cluster(nodes=2, etcd_members=1)
    conf = netconf([[{"subnet": V4, "blockSize": 28}], [{"subnet": V6, "blockSize": 124}]])
    adds, last_failures, serial = [], {}, 0
    while True:  # alternate the nodes until neither gets an address
        round_ok = False
        for node in cluster.nodes:
            serial += 1
            call = ipam(cni_bin, node, "ADD", conf, f"{node.name}-p{serial}")
            if call.ok:
                adds.append(call)
                round_ok = True
            else:
                last_failures[node.name] = call
        if not round_ok:
            break
        assert serial < 4 * USABLE_V4, "more ADDs succeeded than the pool has addresses"

    dump = cluster.etcd.dump()
    view = StoreView.parse(dump)
    assert_store_consistent(view)
    assert_handles_match(view, adds)
    assert_no_duplicates(adds)
    v4 = [ip for c in adds for ip in c.ips() if ":" not in ip]
    assert len(v4) + buffered(view, V4) == USABLE_V4, "usable addresses left unused"
    assert all(ipaddress.ip_address(ip) in ipaddress.ip_network(V4) for ip in v4)

    pool = pool_name_of(dump, V4)
    before = pod_state(view)
    for node in cluster.nodes:
        failed = ipam(cni_bin, node, "ADD", conf, f"{node.name}-late")
        err = failed.run.json
        assert failed.code == 101, failed.run.stdout
        assert pool in err["msg"] and node.name in err["msg"], \
            f"expected 'no address left in pool {pool} for node {node.name}', got {err}"
    assert pod_state(store_view(cluster)) == before, "a failed ADD wrote an allocation"
    checks = [cli_check(cluster, "with the pool exhausted")]

    freed = adds.pop(0)
    node = next(n for n in cluster.nodes if n.name == freed.node)
    assert ipam(cni_bin, node, "DEL", conf, freed.cid).ok
    reuse = ipam(cni_bin, node, "ADD", conf, f"{node.name}-reuse")
    assert reuse.ok, reuse.run.stdout
    assert [ip for ip in reuse.ips() if ":" not in ip] == [ip for ip in freed.ips()
                                                           if ":" not in ip]
    for call in adds + [reuse]:
        node = next(n for n in cluster.nodes if n.name == call.node)
        assert ipam(cni_bin, node, "DEL", conf, call.cid).ok
    view = store_view(cluster)
    assert_store_consistent(view)
    assert_only_buffers_left(view, NETWORK)
    checks.append(cli_check(cluster, "after DEL of every attachment"))
    assert_cli_checks_clean(checks)

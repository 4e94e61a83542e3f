"""Many ADDs and DELs at once on a fresh node: the bridge is created once, no EEXIST failures,
unique addresses, everything reachable, nothing left: a runtime
starts many Pods at once, and two ADDs racing to create or address one bridge must both succeed."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.fixtures.bridge import (
    GATEWAY,
    bridge_conf,
    ip_of,
    new_cid,  # noqa: F401
    pycni_ipam,
)

pytestmark = [pytest.mark.netns, pytest.mark.slow]
PODS = 50


def test_concurrent_adds_then_dels(bridge_node, netns_factory):
    conf = bridge_conf(pycni_ipam())
    pods = [netns_factory("pod") for _ in range(PODS)]
    cids = [new_cid() for _ in pods]
    with ThreadPoolExecutor(max_workers=PODS) as pool:
        started = time.monotonic()
        adds = list(
            pool.map(lambda i: bridge_node.run("ADD", conf, cids[i], pods[i].path), range(PODS))
        )
        add_wall = time.monotonic() - started
        failed = [a.stdout for a in adds if a.code != 0]
        assert not failed, failed[:3]
        ips = [ip_of(a.json) for a in adds]
        assert len(set(ips)) == PODS
        reachable = list(pool.map(lambda pod: pod.ping(GATEWAY, timeout=3), pods))
        assert all(reachable), [p.name for p, ok in zip(pods, reachable, strict=True) if not ok]
        residue = bridge_node.residue()
        assert len(residue.veths) == PODS and len(residue.leases) == PODS
        assert len(residue.elements) == 2 * PODS
        started = time.monotonic()
        dels = list(
            pool.map(lambda i: bridge_node.run("DEL", conf, cids[i], pods[i].path), range(PODS))
        )
        del_wall = time.monotonic() - started
    assert all(d.code == 0 for d in dels), [d.stdout for d in dels if d.code][:3]
    assert bridge_node.residue().is_empty(), bridge_node.residue()
    print(f"{PODS} concurrent ADDs {add_wall:.2f}s, DELs {del_wall:.2f}s")

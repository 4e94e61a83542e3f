"""The lease service on every store (SQLite and a real etcd): the same guarantees on both.

Each test uses a network name of its own, so pools, blocks and handles never collide on a
shared etcd.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from ipam.leases.service import LeaseService
from ipam.records import HandleId
from plugins.ipam.config import parse_ipam_config


@pytest.fixture
def network() -> str:
    return f"n{uuid.uuid4().hex[:10]}"


def range_sets(network: str, *ranges: list[dict]):
    return parse_ipam_config({"name": network, "ipam": {"ranges": list(ranges)}}).range_sets


def test_dual_stack_lease_repeat_and_release(store, network):
    sets = range_sets(network, [{"subnet": "10.40.0.0/24"}], [{"subnet": "fd40::/64"}])
    leases = LeaseService(store, "node1")
    handle = HandleId(network, "c1", "eth0")
    first, created = leases.acquire(handle, sets)
    assert created and [ip.address for ip in first.ips] == ["10.40.0.2/24", "fd40::2/64"]
    again, created = LeaseService(store, "node1").acquire(handle, sets)  # a restarted daemon
    assert not created and again.ips == first.ips
    assert leases.release(handle) is not None and leases.release(handle) is None


def test_nodes_adding_at_once_never_share_an_address(store, network):
    sets = range_sets(network, [{"subnet": "10.41.0.0/24", "blockSize": 28}])
    nodes = [LeaseService(store, f"node{i}") for i in range(3)]
    got: list[str] = []

    def run(node: LeaseService) -> None:
        for i in range(20):
            record, _ = node.acquire(HandleId(network, f"{node.node}-{i}", "eth0"), sets)
            got.extend(ip.address for ip in record.ips)

    threads = [threading.Thread(target=run, args=(node,)) for node in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 60 and len(set(got)) == 60


def test_gc_never_touches_another_nodes_handles(store, network):
    sets = range_sets(network, [{"subnet": "10.42.0.0/24"}])
    mine, theirs = LeaseService(store, "node1"), LeaseService(store, "node2")
    mine.acquire(HandleId(network, "a", "eth0"), sets)
    theirs.acquire(HandleId(network, "b", "eth0"), sets)
    assert mine.collect_garbage(network, None) == [HandleId(network, "a", "eth0")]
    assert [str(r.handle) for r in mine.handles(network)] == [f"{network}/b/eth0"]

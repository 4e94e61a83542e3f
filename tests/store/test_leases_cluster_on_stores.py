"""Cluster pools on every store (SQLite and a real etcd): three nodes at once on one small
pool with borrowing, precise exhaustion with nothing half-written, dual-stack all-or-nothing,
node selectors, and empty blocks going back to the pool.

Each test names its pools uniquely and gives them a node selector of its own, so one etcd
serves the whole module without one test's pools being selected in another.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import pytest

from cni.spec.errors import AddressExhausted
from ipam.alloc.selection import Selection
from ipam.leases.service import LeaseService
from ipam.records import BlockRecord, HandleId, HandleRecord
from store.keys import HANDLES, affinity_prefix, blocks_prefix, handles_prefix
from tests.fixtures.ipam_pools import Clock, put_pool


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:8]


def blocks(store, pool: str) -> list[BlockRecord]:
    return [BlockRecord.from_bytes(kv.key, kv.value) for kv in store.range(blocks_prefix(pool))]


def handles(store, network: str) -> list[HandleRecord]:
    return [
        HandleRecord.from_bytes(kv.key, kv.value) for kv in store.range(handles_prefix(network))
    ]


def test_three_nodes_at_once_on_one_small_pool_never_share_an_address(store, tag):
    pool, network = f"small-{tag}", f"n{tag}"
    put_pool(
        store,
        pool,
        "10.90.0.0/26",
        block_size=29,  # 8 blocks, 62 addresses
        node_selector={"test": tag},
    )
    nodes = [LeaseService(store, f"node{i}-{tag}") for i in range(3)]
    chosen = Selection(network, pools=(pool,))
    got: list[tuple[str, str]] = []
    refused: list[AddressExhausted] = []

    def run(leases: LeaseService) -> None:
        for i in range(25):
            try:
                record, _ = leases.acquire(HandleId(network, f"{leases.node}-{i}", "eth0"), chosen)
                got.append((leases.node, record.ips[0].ip))
            except AddressExhausted as err:
                refused.append(err)

    threads = [threading.Thread(target=run, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ips = [ip for _, ip in got]
    assert len(ips) == len(set(ips)) == 62 and len(refused) == 75 - 62
    assert {e.msg for e in refused} <= {
        f"no address left in pool {pool} for node {n.node}" for n in nodes
    }
    stored = handles(store, network)  # nothing half-written: every lease is whole
    allocations = {ip: holder for b in blocks(store, pool) for ip, holder in b.allocations.items()}
    assert len(stored) == 62 and allocations == {r.ips[0].ip: str(r.handle) for r in stored}
    borrowed = Counter(ip for b in blocks(store, pool) for ip in b.borrowed)
    assert len(borrowed) == sum(1 for r in stored if "borrowedFrom" in r.attributes)
    for node_name, ip in got:  # a node holds only its own blocks' addresses unless borrowed
        block = next(b for b in blocks(store, pool) if ip in b.allocations)
        assert block.affinity == node_name or block.borrowed[ip] == node_name

    def release(leases: LeaseService) -> None:
        for record in stored:
            if record.node == leases.node:
                leases.release(record.handle)

    threads = [threading.Thread(target=release, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert handles(store, network) == []
    assert all(not b.allocations and not b.borrowed for b in blocks(store, pool))


def test_dual_stack_from_node_selected_pools_is_all_or_nothing(store, tag):
    labels = {"test": tag}
    put_pool(store, f"v4-{tag}", "10.91.0.0/30", block_size=30, node_selector=labels)  # .1 .2
    put_pool(store, f"v6-{tag}", "fd91::/64", node_selector=labels)
    put_pool(store, f"other-{tag}", "10.92.0.0/24", node_selector={"test": "x" + tag})
    leases = LeaseService(store, f"node-{tag}", labels=labels)
    network = f"n{tag}"
    for cid in ("a", "b"):
        record, _ = leases.acquire(HandleId(network, cid, "eth0"), Selection(network))
        assert [ip.pool for ip in record.ips] == [f"v4-{tag}", f"v6-{tag}"]
    before = store.revision()
    with pytest.raises(AddressExhausted, match=f"no address left in pool v4-{tag}"):
        leases.acquire(HandleId(network, "c", "eth0"), Selection(network))
    assert store.revision() == before and len(handles(store, network)) == 2
    assert sum(len(b.allocations) for b in blocks(store, f"v6-{tag}")) == 2


def test_empty_blocks_go_back_and_can_be_claimed_again(store, tag):
    pool, network, clock = f"p-{tag}", f"n{tag}", Clock()
    put_pool(
        store, pool, "10.93.0.0/24", block_size=26, reuse_delay=30, node_selector={"test": tag}
    )
    leases = LeaseService(store, f"node-{tag}", clock=clock, block_grace=60)
    chosen = Selection(network, pools=(pool,))
    record, _ = leases.acquire(HandleId(network, "a", "eth0"), chosen)
    leases.release(record.handle)
    clock.advance(61)
    assert leases.return_empty_blocks() == [f"{pool} {record.ips[0].block}"]
    assert blocks(store, pool) == []
    assert store.range(affinity_prefix(leases.node, pool)) == []
    other = LeaseService(store, f"other-{tag}", clock=clock)
    again, _ = other.acquire(HandleId(network, "b", "eth0"), chosen)
    assert [b.affinity for b in blocks(store, pool)] == [other.node]
    assert not store.range(f"{HANDLES}{network}/a/")
    assert again.ips[0].ip


def test_many_concurrent_adds_of_one_node_are_unique_and_whole(store, tag):
    put_pool(store, f"v4-{tag}", "10.94.0.0/24", block_size=28, node_selector={"test": tag})
    put_pool(store, f"v6-{tag}", "fd94::/64", node_selector={"test": tag})
    leases, network = LeaseService(store, f"node-{tag}", labels={"test": tag}), f"n{tag}"
    results, errors = [], []

    def add(i: int) -> None:
        try:
            results.append(
                leases.acquire(HandleId(network, f"c{i}", "eth0"), Selection(network))[0]
            )
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    got = [ip.ip for r in results for ip in r.ips]
    assert len(got) == len(set(got)) == 80
    assert sorted(str(r.handle) for r in handles(store, network)) == sorted(
        str(r.handle) for r in results
    )

"""The lease service on a real SqliteStore: ADD/DEL/GC semantics, conflicts, concurrency."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from cni.spec.errors import AddressConflict, AddressExhausted, NotAvailable
from ipam.leases.service import LeaseService
from ipam.records import BlockRecord, HandleId
from plugins.ipam.config import parse_ipam_config
from store.base import Compare, Put
from store.codec import decode, encode
from store.keys import block_key, pool_key
from store.sqlite import SqliteStore


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(str(tmp_path / "store.db"))
    yield s
    s.close()


@pytest.fixture
def leases(store):
    return LeaseService(store, "node1")


def sets(*ranges: list[dict], network: str = "net"):
    return parse_ipam_config({"name": network, "ipam": {"ranges": list(ranges)}}).range_sets


V4 = sets([{"subnet": "10.22.0.0/16"}])
DUAL = sets([{"subnet": "10.22.0.0/16"}], [{"subnet": "fd00::/64"}])


def h(cid: str, ifname: str = "eth0", network: str = "net") -> HandleId:
    return HandleId(network, cid, ifname)


def ips(record) -> list[str]:
    return [ip.address for ip in record.ips]


def block(store, pool: str, cidr: str) -> BlockRecord:
    kv = store.get(block_key(pool, cidr))
    return BlockRecord.from_bytes(kv.key, kv.value)


def test_first_lease_is_the_first_address_after_the_gateway(leases, store):
    record, created = leases.acquire(h("c1"), V4, attributes={"namespace": "ns", "pod": "p"})
    assert created and ips(record) == ["10.22.0.2/16"]
    assert record.ips[0].gateway == "10.22.0.1"
    assert dict(record.attributes) == {"namespace": "ns", "pod": "p", "node": "node1"}
    assert block(store, "net-10.22.0.0-16", "10.22.0.0/26").allocations == {
        "10.22.0.2": "net/c1/eth0"
    }
    pool = decode("p", store.get(pool_key("net-10.22.0.0-16")).value)
    assert (pool["cidr"], pool["blockSize"], pool["disabled"]) == ("10.22.0.0/16", 26, False)


def test_repeated_add_returns_the_same_addresses(leases, store):
    first, _ = leases.acquire(h("c1"), DUAL)
    revision = store.revision()
    again, created = leases.acquire(h("c1"), DUAL)
    assert not created and ips(again) == ips(first) == ["10.22.0.2/16", "fd00::2/64"]
    assert store.revision() == revision  # nothing written


def test_each_attachment_gets_its_own_address(leases):
    a, _ = leases.acquire(h("c1", "eth0"), V4)
    b, _ = leases.acquire(h("c1", "net1"), V4)
    c, _ = leases.acquire(
        h("c1", "eth0", network="other"), sets([{"subnet": "10.22.0.0/16"}], network="other")
    )
    assert ips(a) == ["10.22.0.2/16"] and ips(b) == ["10.22.0.3/16"]
    assert ips(c) == ["10.22.0.2/16"]  # another network is another pool


def test_release_frees_and_is_idempotent(leases, store):
    leases.acquire(h("c1"), DUAL)
    released = leases.release(h("c1"))
    assert released is not None and ips(released) == ["10.22.0.2/16", "fd00::2/64"]
    assert leases.release(h("c1")) is None
    assert leases.lookup(h("c1")) is None
    assert block(store, "net-10.22.0.0-16", "10.22.0.0/26").allocations == {}


def test_released_address_is_not_reused_at_once(leases):
    leases.acquire(h("c1"), V4)
    leases.release(h("c1"))
    record, _ = leases.acquire(h("c2"), V4)
    assert ips(record) == ["10.22.0.3/16"]


def test_exhaustion_names_range_and_node(leases):
    tiny = sets([{"subnet": "10.9.0.0/29"}])  # .2 .. .6
    got = {ips(leases.acquire(h(f"c{i}"), tiny)[0])[0] for i in range(5)}
    assert got == {f"10.9.0.{i}/29" for i in range(2, 7)}
    with pytest.raises(AddressExhausted) as info:
        leases.acquire(h("c-last"), tiny)
    assert info.value.code == 101
    assert (
        "no address left in range 10.9.0.0/29 (10.9.0.1-10.9.0.6) for node node1" in info.value.msg
    )
    assert leases.lookup(h("c-last")) is None


def test_dual_stack_is_all_or_nothing(leases, store):
    one_v6 = sets(
        [{"subnet": "10.22.0.0/16"}],
        [{"subnet": "fd00::/120", "rangeStart": "fd00::5", "rangeEnd": "fd00::5"}],
    )
    leases.acquire(h("c1"), one_v6)
    before = store.revision()
    with pytest.raises(AddressExhausted, match="fd00::/120"):
        leases.acquire(h("c2"), one_v6)
    assert store.revision() == before
    assert leases.lookup(h("c2")) is None
    assert list(block(store, "net-10.22.0.0-16", "10.22.0.0/26").allocations) == ["10.22.0.2"]


def test_static_address_is_claimed_and_a_conflict_names_the_holder(leases, store):
    wanted = {0: __import__("ipaddress").ip_address("10.22.7.9")}
    record, _ = leases.acquire(h("c1"), V4, wanted)
    assert ips(record) == ["10.22.7.9/16"]
    assert block(store, "net-10.22.0.0-16", "10.22.7.0/26").affinity == "node1"
    before = store.revision()
    with pytest.raises(AddressConflict) as info:
        leases.acquire(h("c2"), DUAL, wanted)
    assert info.value.code == 102 and "net/c1/eth0" in info.value.msg
    assert store.revision() == before and leases.lookup(h("c2")) is None
    again, created = leases.acquire(h("c1"), V4, wanted)
    assert not created and ips(again) == ["10.22.7.9/16"]


def test_asking_an_existing_lease_for_another_address_is_a_conflict(leases):
    import ipaddress

    leases.acquire(h("c1"), V4)
    with pytest.raises(AddressConflict, match="already holds 10.22.0.2"):
        leases.acquire(h("c1"), V4, {0: ipaddress.ip_address("10.22.0.50")})


def test_static_address_in_another_nodes_block(store):
    import ipaddress

    node1, node2 = LeaseService(store, "node1"), LeaseService(store, "node2")
    node1.acquire(h("c1"), V4)
    record, _ = node2.acquire(h("c2"), V4, {0: ipaddress.ip_address("10.22.0.30")})
    assert ips(record) == ["10.22.0.30/16"]
    b = block(store, "net-10.22.0.0-16", "10.22.0.0/26")
    assert b.affinity == "node1" and b.allocations["10.22.0.30"] == "net/c2/eth0"
    assert ips(node1.acquire(h("c3"), V4)[0]) == ["10.22.0.3/16"]  # node1's stale cache recovers
    node2.release(h("c2"))
    assert "10.22.0.30" not in block(store, "net-10.22.0.0-16", "10.22.0.0/26").allocations


def test_two_nodes_claim_different_blocks(store):
    node1, node2 = LeaseService(store, "node1"), LeaseService(store, "node2")
    a, _ = node1.acquire(h("a"), DUAL)
    b, _ = node2.acquire(h("b"), DUAL)
    assert ips(a) == ["10.22.0.2/16", "fd00::2/64"]
    assert ips(b) == ["10.22.0.64/16", "fd00::40/64"]
    assert block(store, "net-10.22.0.0-16", "10.22.0.64/26").affinity == "node2"


def test_node_without_free_block_is_exhausted_even_if_others_have_room(store):
    small = sets([{"subnet": "10.9.0.0/25"}])  # two /26 blocks
    node1, node2, node3 = (LeaseService(store, n) for n in ("node1", "node2", "node3"))
    node1.acquire(h("a"), small)
    node2.acquire(h("b"), small)
    with pytest.raises(AddressExhausted, match="for node node3"):
        node3.acquire(h("c"), small)


def test_stale_cache_conflict_is_retried(leases, store):
    leases.acquire(h("c1"), V4)
    key = block_key("net-10.22.0.0-16", "10.22.0.0/26")
    kv = store.get(key)  # an outside writer (the CLI) touches our block
    edited = BlockRecord.from_bytes(key, kv.value).with_allocation("10.22.0.3", "net/x/eth0")
    assert store.txn([Compare(key, kv.mod_revision)], [Put(key, edited.to_bytes())]).succeeded
    conflicts = []
    leases.on_conflict = lambda: conflicts.append(1)
    record, _ = leases.acquire(h("c2"), V4)
    assert ips(record) == ["10.22.0.4/16"] and conflicts == [1]


def test_exhaustion_rereads_the_store_before_giving_up(leases, store):
    tiny = sets([{"subnet": "10.9.0.0/29"}])
    for i in range(5):
        leases.acquire(h(f"c{i}"), tiny)
    key = block_key("net-10.9.0.0-29", "10.9.0.0/29")
    kv = store.get(key)  # an outside writer (the CLI) frees .4 behind the cache's back
    freed = BlockRecord.from_bytes(key, kv.value).without("10.9.0.4")
    store.txn([Compare(key, kv.mod_revision)], [Put(key, freed.to_bytes())])
    assert ips(leases.acquire(h("c9"), tiny)[0]) == ["10.9.0.4/29"]


def test_disabled_pool_gives_no_address(leases, store):
    leases.acquire(h("c1"), V4)
    key = pool_key("net-10.22.0.0-16")
    kv = store.get(key)
    store.txn(
        [Compare(key, kv.mod_revision)],
        [Put(key, encode({**decode(key, kv.value), "disabled": True}))],
    )
    with pytest.raises(AddressExhausted, match="pool disabled"):
        leases.acquire(h("c2"), V4)


def test_pool_record_keeps_stored_block_size(leases, store):
    key = pool_key("net-10.22.0.0-16")
    store.txn(
        [],
        [
            Put(
                key,
                encode(
                    {
                        "name": "net-10.22.0.0-16",
                        "cidr": "10.22.0.0/16",
                        "blockSize": 28,
                        "owner": "cli",
                    }
                ),
            )
        ],
    )
    record, _ = leases.acquire(h("c1"), V4)
    assert record.ips[0].block == "10.22.0.0/28"
    stored = decode(key, store.get(key).value)
    assert stored["blockSize"] == 28 and stored["owner"] == "cli" and stored["ranges"]


def test_gc_releases_only_this_nodes_invalid_handles(store):
    node1, node2 = LeaseService(store, "node1"), LeaseService(store, "node2")
    for cid in ("keep", "stale1", "stale2"):
        node1.acquire(h(cid), V4)
    node1.acquire(h("keep", "net1"), V4)
    node2.acquire(h("other-node"), V4)
    node1.acquire(h("stale1", network="net2"), sets([{"subnet": "10.50.0.0/24"}], network="net2"))
    released = node1.collect_garbage("net", {("keep", "eth0")})
    assert sorted(str(x) for x in released) == [
        "net/keep/net1",
        "net/stale1/eth0",
        "net/stale2/eth0",
    ]
    assert node1.lookup(h("keep")) is not None
    assert node1.lookup(h("other-node")) is not None  # another node's: never touched
    assert node1.lookup(h("stale1", network="net2")) is not None  # another network
    assert node1.collect_garbage("net", None) == [h("keep")]  # None: nothing is valid
    assert node1.lookup(h("other-node")) is not None


def test_gc_valid_entry_without_ifname_keeps_every_ifname(leases):
    leases.acquire(h("c1", "eth0"), V4)
    leases.acquire(h("c1", "net1"), V4)
    assert leases.collect_garbage("net", {("c1", "")}) == []


def test_capacity_check(leases):
    tiny = sets([{"subnet": "10.9.0.0/30"}])
    leases.ensure_capacity("net", tiny)
    leases.acquire(h("c1"), tiny)
    with pytest.raises(NotAvailable, match="no address left"):
        leases.ensure_capacity("net", tiny)
    leases.release(h("c1"))
    leases.ensure_capacity("net", tiny)


def test_concurrent_adds_on_one_node_are_unique(leases):
    results: list[str] = []
    errors: list[Exception] = []

    def add(i: int) -> None:
        try:
            results.extend(ips(leases.acquire(h(f"c{i}"), DUAL)[0]))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 100 and len(set(results)) == 100


def test_concurrent_nodes_on_one_store_never_share_an_address(tmp_path):
    path = str(tmp_path / "shared.db")
    stores = [SqliteStore(path) for _ in range(3)]
    nodes = [LeaseService(s, f"node{i}") for i, s in enumerate(stores)]
    small = sets([{"subnet": "10.9.0.0/24", "blockSize": 28}])
    got: list[str] = []
    errors: list[Exception] = []

    def run(node: LeaseService, n: int) -> None:
        for i in range(n):
            try:
                got.extend(ips(node.acquire(h(f"{node.node}-{i}"), small)[0]))
            except AddressExhausted as exc:
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(node, 30)) for node in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert len(got) == len(set(got)) == 90 and not errors


def test_corrupt_record_is_an_internal_error_naming_the_key(leases, store):
    store.txn([], [Put(h("bad").key, b"{not json")])
    with pytest.raises(Exception) as info:
        leases.acquire(h("bad"), V4)
    assert getattr(info.value, "code", None) == 999 and h("bad").key in info.value.msg


def test_dataclass_records_round_trip():
    b = BlockRecord("p", "10.0.0.0/26", "n", {"10.0.0.2": "x"}, "10.0.0.2", 1.5, {"future": 1})
    assert BlockRecord.from_bytes("k", b.to_bytes()) == b
    assert replace(b, affinity="m").affinity == "m"

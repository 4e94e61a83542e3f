"""The lease service on cluster pools, on a real SqliteStore with a hand-moved clock: pools by
name and by node selector, gateway "first", borrowing and strictAffinity, reuse delay, empty
blocks going back after the grace period, disabled and edited pools, static requests, and
concurrent ADDs of one node combined into one txn."""

from __future__ import annotations

import ipaddress
import threading
import time

import pytest

from cni.spec.errors import AddressConflict, AddressExhausted, InvalidConfig, TryAgainLater
from ipam.alloc.selection import Selection
from ipam.leases.service import LeaseService
from ipam.records import BlockRecord, HandleId
from store.keys import affinity_key, block_key, blocks_prefix
from store.sqlite import SqliteStore
from tests.fixtures.ipam_pools import Clock, edit_pool, put_pool


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(str(tmp_path / "store.db"))
    yield s
    s.close()


@pytest.fixture
def clock():
    return Clock()


def node(store, name: str, clock, **kw) -> LeaseService:
    return LeaseService(store, name, clock=clock, **kw)


def h(cid: str, network: str = "net") -> HandleId:
    return HandleId(network, cid, "eth0")


def by_name(*pools: str) -> Selection:
    return Selection("net", pools=pools)


def addresses(record) -> list[str]:
    return [ip.address for ip in record.ips]


def blocks(store, pool: str) -> dict[str, BlockRecord]:
    return {
        b.cidr: b
        for b in (
            BlockRecord.from_bytes(kv.key, kv.value) for kv in store.range(blocks_prefix(pool))
        )
    }


def test_named_pools_dual_stack_gateway_first_and_attributes(store, clock):
    put_pool(store, "v4", "10.60.0.0/16", gateway="first")
    put_pool(store, "v6", "fd60::/64")
    leases = node(store, "node1", clock)
    attrs = {"namespace": "ns", "pod": "web", "podUID": "u-1"}
    record, created = leases.acquire(h("c1"), by_name("v6", "v4"), attributes=attrs)
    assert created and [ip.pool for ip in record.ips] == ["v4", "v6"]  # IPv4 first
    v4, v6 = record.ips
    block = ipaddress.ip_network(v4.block)  # a /26 somewhere in the pool (seeded by node)
    first_usable = block.network_address + (
        block.network_address == block.supernet(10).network_address
    )  # the pool's network address
    assert v4.gateway == str(first_usable) and v4.ip != v4.gateway
    assert v4.address.endswith("/16") and v6.gateway is None and v6.address.endswith("/64")
    assert dict(record.attributes) == {**attrs, "node": "node1"}
    again, created = leases.acquire(h("c1"), by_name("v4", "v6"))
    assert not created and again.ips == record.ips
    assert store.get(affinity_key("node1", "v4", v4.block)) is not None


def test_node_selector_chooses_the_pools_of_this_nodes_labels(store, clock):
    put_pool(store, "zone-a", "10.61.0.0/24", node_selector={"zone": "a"})
    put_pool(store, "zone-b", "10.62.0.0/24", node_selector={"zone": "b"})
    put_pool(store, "off", "10.63.0.0/24", disabled=True)
    a = node(store, "node-a", clock, labels={"zone": "a"})
    b = node(store, "node-b", clock, labels={"zone": "b", "rack": "7"})
    assert [ip.pool for ip in a.acquire(h("a"), Selection("net"))[0].ips] == ["zone-a"]
    assert [ip.pool for ip in b.acquire(h("b"), Selection("net"))[0].ips] == ["zone-b"]
    lost = node(store, "node-c", clock, labels={"zone": "c"})
    with pytest.raises(AddressExhausted, match="no IP pool selects node node-c"):
        lost.acquire(h("c"), Selection("net"))


def test_unknown_named_pool_is_invalid_config(store, clock):
    with pytest.raises(InvalidConfig) as info:
        node(store, "node1", clock).acquire(h("c1"), by_name("nope"))
    assert info.value.code == 7 and "no IP pool named 'nope'" in info.value.msg


def test_a_pool_created_after_the_first_add_is_found_by_name(store, clock):
    put_pool(store, "first", "10.64.0.0/24")
    leases = node(store, "node1", clock)
    leases.acquire(h("c1"), by_name("first"))
    put_pool(store, "second", "10.65.0.0/24")
    assert leases.acquire(h("c2"), by_name("second"))[0].ips[0].pool == "second"


def fill_tiny_pool(store, clock, **settings) -> tuple[LeaseService, LeaseService]:
    """Pool "tiny": 10.66.0.0/27 in two /28 blocks of 15 addresses; node1 and node2 claim
    one each and fill them."""
    put_pool(store, "tiny", "10.66.0.0/27", block_size=28, **settings)
    one, two = node(store, "node1", clock), node(store, "node2", clock)
    for leases in (one, two):
        for i in range(15):
            leases.acquire(h(f"{leases.node}-{i}"), by_name("tiny"))
    assert sorted(b.affinity for b in blocks(store, "tiny").values()) == ["node1", "node2"]
    return one, two


def test_borrowing_when_the_pool_has_no_free_block(store, clock):
    put_pool(store, "tiny", "10.66.0.0/27", block_size=28)
    one, two, three = (node(store, n, clock) for n in ("node1", "node2", "node3"))
    a, _ = one.acquire(h("a"), by_name("tiny"))
    two.acquire(h("b"), by_name("tiny"))
    c, _ = three.acquire(h("c"), by_name("tiny"))  # no free block left: borrows
    owner = c.attributes["borrowedFrom"]
    assert owner in ("node1", "node2") and c.node == "node3"
    lent = blocks(store, "tiny")[c.ips[0].block]
    assert lent.affinity == owner and lent.borrowed == {c.ips[0].ip: "node3"}
    got = {
        ip
        for leases in (one, two)
        for i in range(10)
        for ip in addresses(leases.acquire(h(f"{leases.node}-{i}"), by_name("tiny"))[0])
    }
    assert len(got) == 20 and c.ips[0].address not in got  # the owners' stale caches recover
    assert three.release(h("c")) is not None
    assert c.ips[0].ip not in blocks(store, "tiny")[c.ips[0].block].borrowed


def test_strict_affinity_exhaustion_is_precise_and_writes_nothing(store, clock):
    fill_tiny_pool(store, clock, strict_affinity=True)
    three = node(store, "node3", clock)
    before = store.revision()
    with pytest.raises(AddressExhausted) as info:
        three.acquire(h("late"), by_name("tiny"))
    assert info.value.code == 101
    assert info.value.msg == "no address left in pool tiny for node node3"
    assert "strictAffinity" in info.value.details
    assert store.revision() == before and three.lookup(h("late")) is None


def test_exhausted_pool_with_borrowing_is_precise_and_dual_stack_writes_nothing(store, clock):
    one, _ = fill_tiny_pool(store, clock)
    put_pool(store, "v6", "fd66::/64")
    before = store.revision()
    with pytest.raises(AddressExhausted, match="no address left in pool tiny for node node1"):
        one.acquire(h("late"), by_name("v6", "tiny"))
    assert store.revision() == before and one.lookup(h("late")) is None
    assert not list(store.range(blocks_prefix("v6")))


def test_reuse_delay_skips_recently_released_addresses(store, clock):
    put_pool(store, "small", "10.67.0.0/29", block_size=29, reuse_delay=120)  # .1 - .6
    leases = node(store, "node1", clock)
    for i in range(1, 7):
        assert addresses(leases.acquire(h(f"c{i}"), by_name("small"))[0]) == [f"10.67.0.{i}/29"]
    leases.release(h("c5"))
    clock.advance(150)  # .5 has cooled down
    leases.release(h("c2"))  # .2 starts cooling
    clock.advance(10)
    assert addresses(leases.acquire(h("x"), by_name("small"))[0]) == ["10.67.0.5/29"]
    assert addresses(leases.acquire(h("y"), by_name("small"))[0]) == ["10.67.0.2/29"]  # last one
    from ipam.leases.metrics import read_usage

    leases.release(h("c3"))
    usage, _ = read_usage(store, clock())
    assert usage["small"]["cooling"] == 1 and usage["small"]["used"] == 5


def test_empty_block_returns_after_the_grace_period(store, clock):
    put_pool(store, "p", "10.68.0.0/24", block_size=26, reuse_delay=60)
    leases = node(store, "node1", clock, block_grace=300)
    record, _ = leases.acquire(h("c1"), by_name("p"))
    cidr = record.ips[0].block
    leases.release(h("c1"))
    assert blocks(store, "p")[cidr].empty_since == clock()
    clock.advance(299)
    assert leases.return_empty_blocks() == []
    clock.advance(2)
    assert leases.return_empty_blocks() == [f"p {cidr}"]
    assert store.get(block_key("p", cidr)) is None
    assert store.get(affinity_key("node1", "p", cidr)) is None
    again, _ = leases.acquire(h("c2"), by_name("p"))  # claims afresh
    assert blocks(store, "p")[again.ips[0].block].affinity == "node1"


def test_a_block_is_kept_while_an_address_cools_or_once_it_is_used_again(store, clock):
    put_pool(store, "p", "10.69.0.0/24", block_size=26, reuse_delay=600)
    leases = node(store, "node1", clock, block_grace=300)
    cidr = leases.acquire(h("c1"), by_name("p"))[0].ips[0].block
    leases.release(h("c1"))
    clock.advance(400)
    assert leases.return_empty_blocks() == []  # still cooling (600 s)
    leases.acquire(h("c2"), by_name("p"))
    clock.advance(1000)
    assert leases.return_empty_blocks() == [] and cidr in blocks(store, "p")


def test_returning_a_block_compares_it(store, clock):
    """Another node borrowed into the empty block behind node1's cache: the return loses."""
    put_pool(store, "one", "10.70.0.0/28", block_size=28, reuse_delay=0)
    owner, borrower = node(store, "node1", clock, block_grace=10), node(store, "node2", clock)
    cidr = owner.acquire(h("a"), by_name("one"))[0].ips[0].block
    owner.release(h("a"))
    clock.advance(20)
    borrowed, _ = borrower.acquire(h("b"), by_name("one"))
    assert borrowed.attributes["borrowedFrom"] == "node1"
    assert owner.return_empty_blocks() == []
    assert blocks(store, "one")[cidr].allocations == {borrowed.ips[0].ip: str(h("b"))}


def test_disabled_pool_keeps_existing_leases_and_refuses_new_ones(store, clock):
    put_pool(store, "p", "10.71.0.0/24")
    leases = node(store, "node1", clock)
    leases.acquire(h("a"), by_name("p"))
    edit_pool(store, "p", disabled=True)  # behind the cache: the txn's compare catches it
    with pytest.raises(AddressExhausted, match="pool disabled"):
        leases.acquire(h("b"), by_name("p"))
    assert leases.lookup(h("a")) is not None and leases.lookup(h("b")) is None
    assert leases.release(h("a")) is not None


def test_exclusions_added_later_are_honoured(store, clock):
    put_pool(store, "p", "10.72.0.0/24", block_size=24)
    leases = node(store, "node1", clock)
    assert addresses(leases.acquire(h("a"), by_name("p"))[0]) == ["10.72.0.1/24"]
    edit_pool(store, "p", exclusions=["10.72.0.2-10.72.0.9"])
    assert addresses(leases.acquire(h("b"), by_name("p"))[0]) == ["10.72.0.10/24"]


def test_static_request_held_elsewhere_names_the_holder_and_allocates_nothing(store, clock):
    put_pool(store, "v4", "10.73.0.0/24")
    put_pool(store, "v6", "fd73::/64")
    one, two = node(store, "node1", clock), node(store, "node2", clock)
    held, _ = one.acquire(
        h("a"),
        by_name("v4", "v6"),
        [ipaddress.ip_address("10.73.0.50")],
        {"namespace": "prod", "pod": "db-0"},
    )
    assert addresses(held)[0] == "10.73.0.50/24"
    before = store.revision()
    with pytest.raises(AddressConflict) as info:
        two.acquire(h("b"), by_name("v4", "v6"), [ipaddress.ip_address("10.73.0.50")])
    assert info.value.code == 102 and "already held by net/a/eth0" in info.value.msg
    assert "pod prod/db-0" in info.value.details and "node node1" in info.value.details
    assert store.revision() == before and two.lookup(h("b")) is None
    mine, _ = two.acquire(h("c"), by_name("v4"), [ipaddress.ip_address("10.73.0.51")])
    assert mine.attributes.get("borrowedFrom") == "node1"  # in node1's block


def test_repeated_add_after_an_outside_release_gets_a_fresh_lease(store, clock):
    put_pool(store, "p", "10.74.0.0/24")
    leases = node(store, "node1", clock)
    first, _ = leases.acquire(h("a"), by_name("p"))
    LeaseService(store, "cli", clock=clock).release(h("a"))  # e.g. `pycni ipam release`
    again, created = leases.acquire(h("a"), by_name("p"))  # the cache never answers alone
    assert created and leases.lookup(h("a")) == again
    assert again.ips[0].ip != first.ips[0].ip  # the released one cools down


class SlowStore(SqliteStore):
    """A real SqliteStore whose txns take a while, so concurrent requests pile up."""

    txns = 0

    def txn(self, compares, ops):
        self.txns += 1
        time.sleep(0.02)
        return super().txn(compares, ops)


def test_concurrent_adds_of_one_node_share_txns_and_a_failing_one_is_left_out(tmp_path, clock):
    store = SlowStore(str(tmp_path / "slow.db"))
    try:
        put_pool(store, "p", "10.75.0.0/24", block_size=24)
        leases = node(store, "node1", clock)
        leases.acquire(h("held"), by_name("p"), [ipaddress.ip_address("10.75.0.200")])
        store.txns = 0
        results, errors = [], []

        def add(i: int) -> None:
            wanted = [ipaddress.ip_address("10.75.0.200")] if i == 7 else []
            try:
                results.append(leases.acquire(h(f"c{i}"), by_name("p"), wanted)[0])
            except AddressConflict as err:
                errors.append(err)

        threads = [threading.Thread(target=add, args=(i,)) for i in range(30)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = [ip.ip for r in results for ip in r.ips]
        assert len(got) == len(set(got)) == 29 and len(errors) == 1
        assert store.txns < 29  # combined
        assert len(blocks(store, "p")["10.75.0.0/24"].allocations) == 30
    finally:
        store.close()


def test_a_static_request_is_not_refused_on_a_stale_cache(store, clock):
    """node2 borrowed into node1's block and released it behind node1's cache: node1 can
    still be asked for that address."""
    put_pool(store, "one", "10.76.0.0/28", block_size=28)
    owner, borrower = node(store, "node1", clock), node(store, "node2", clock)
    owner.acquire(h("a"), by_name("one"))
    lent, _ = borrower.acquire(h("b"), by_name("one"))
    owner.acquire(h("c"), by_name("one"))  # node1's cache now holds node2's allocation
    borrower.release(h("b"))
    wanted = ipaddress.ip_address(lent.ips[0].ip)
    record, created = owner.acquire(h("d"), by_name("one"), [wanted])
    assert created and record.ips[0].ip == str(wanted)


class FlakyStore(SqliteStore):
    """A real SqliteStore whose next txn applies but answers 'try again later', as a store
    whose reply is lost (etcd member killed after the commit, a deadline passed) does."""

    lose_reply = False

    def txn(self, compares, ops):
        result = super().txn(compares, ops)
        if self.lose_reply:
            self.lose_reply = False
            raise TryAgainLater("the store did not answer", "reply lost")
        return result


def test_a_failed_add_whose_txn_landed_is_rolled_back(tmp_path, clock):
    store = FlakyStore(str(tmp_path / "flaky.db"))
    try:
        put_pool(store, "p", "10.77.0.0/24")
        leases = node(store, "node1", clock)
        store.lose_reply = True
        with pytest.raises(TryAgainLater):
            leases.acquire(h("lost"), by_name("p"))
        assert leases.lookup(h("lost")) is not None  # it landed: in doubt
        assert leases.resolve_in_doubt() == [h("lost")]
        assert leases.lookup(h("lost")) is None and leases.cache.in_doubt == {}
        assert all(not b.allocations for b in blocks(store, "p").values())
        store.lose_reply = True  # the runtime retries the ADD before the rollback ran:
        with pytest.raises(TryAgainLater):
            leases.acquire(h("again"), by_name("p"))
        retried, created = leases.acquire(h("again"), by_name("p"))
        assert not created and leases.resolve_in_doubt() == []  # taken by the retry: kept
        assert leases.lookup(h("again")) == retried
    finally:
        store.close()


def test_rolling_back_a_lease_in_a_cached_block_frees_its_address(tmp_path, clock):
    """The node's cache knew the block before the lost reply, so it does not show the
    in-doubt allocation: the rollback must not delete the handle and leave its address held
    by a handle that no longer exists (seen in the three-node etcd outage drill)."""
    store = FlakyStore(str(tmp_path / "flaky.db"))
    try:
        put_pool(store, "p", "10.79.0.0/24")
        leases = node(store, "node1", clock)
        first, _ = leases.acquire(h("first"), by_name("p"))  # the block is now in the cache
        store.lose_reply = True
        with pytest.raises(TryAgainLater):
            leases.acquire(h("lost"), by_name("p"))
        assert leases.resolve_in_doubt() == [h("lost")]
        held = {ip: who for b in blocks(store, "p").values() for ip, who in b.allocations.items()}
        assert held == {first.ips[0].ip: str(h("first"))}
        assert leases.lookup(h("lost")) is None
    finally:
        store.close()


def test_housekeeping_rolls_back_in_doubt_leases_by_itself(tmp_path, clock):
    from ipam.leases.housekeeping import Housekeeping

    store = FlakyStore(str(tmp_path / "flaky.db"))
    leases = node(store, "node1", clock)
    keeper = Housekeeping(leases, 0).start()
    try:
        put_pool(store, "p", "10.78.0.0/24")
        store.lose_reply = True
        with pytest.raises(TryAgainLater):
            leases.acquire(h("lost"), by_name("p"))
        deadline = time.monotonic() + 5
        while leases.lookup(h("lost")) is not None:
            assert time.monotonic() < deadline, "the in-doubt lease was not rolled back"
            time.sleep(0.05)
    finally:
        keeper.stop()
        store.close()

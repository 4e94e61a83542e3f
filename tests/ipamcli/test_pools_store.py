"""Pool CRUD on real stores (SQLite and etcd): validation, CAS, rm with and without force."""

from __future__ import annotations

import json
import threading

import pytest

from cni.spec.errors import AddressConflict
from ipam.alloc.pool_settings import PoolInvalid
from ipam.alloc.pool_spec import make_pool
from ipam.ops.check import find_problems
from ipam.ops.pool_update import PoolUpdate
from ipam.ops.pools import (
    MARKER,
    PoolInUse,
    PoolNotFound,
    add_pool,
    list_pools,
    remove_pool,
    set_pool,
)
from ipam.ops.repair import read_snapshot
from tests.fixtures.ipam_contents import Contents, affinity_key, block_key

P = "/pycni/v1/"


def record(store, key: str) -> dict | None:
    kv = store.get(key)
    return json.loads(kv.value) if kv else None


def test_add_stores_the_cluster_pool_record_and_bumps_the_marker(store):
    stored = add_pool(
        store,
        make_pool(
            "v4",
            "10.60.0.0/16",
            exclusions=["10.60.0.0/30"],
            node_selector={"zone": "a"},
            created_at=5.0,
        ),
    )
    assert (
        record(store, f"{P}pools/v4")
        == stored
        == {
            "name": "v4",
            "cidr": "10.60.0.0/16",
            "blockSize": 26,
            "disabled": False,
            "nodeSelector": {"zone": "a"},
            "strictAffinity": False,
            "exclusions": ["10.60.0.0/30"],
            "gateway": "none",
            "reuseDelay": 120,
            "createdAt": 5.0,
        }
    )
    assert record(store, MARKER)["pool"] == "v4"
    assert [v.name for v in list_pools(store)] == ["v4"]


def test_add_refuses_duplicates_and_overlaps(store):
    add_pool(store, make_pool("a", "10.60.0.0/16"))
    add_pool(store, make_pool("a6", "fd00:60::/64"))
    with pytest.raises(AddressConflict, match="pool a already exists"):
        add_pool(store, make_pool("a", "10.61.0.0/16"))
    with pytest.raises(AddressConflict, match=r"10.60.128.0/17 overlaps pool a \(10.60.0.0/16\)"):
        add_pool(store, make_pool("b", "10.60.128.0/17"))
    with pytest.raises(AddressConflict, match="overlaps pool a6"):
        add_pool(store, make_pool("b6", "fd00:60::/48"))
    c = Contents()
    name = c.netconf_pool("net", "10.70.0.0/24")
    c.write(store)
    with pytest.raises(AddressConflict, match=f"netconf pool of network net {name}"):
        add_pool(store, make_pool("c", "10.70.0.0/16"))
    add_pool(store, make_pool("d", "10.61.0.0/16"))  # disjoint: fine


def test_concurrent_adds_of_overlapping_pools_one_wins(store_kind, request):
    """Two operators at once: the marker key makes the loser re-read and see the winner."""
    from store.etcd import EtcdStore
    from store.sqlite import SqliteStore

    def open_one():
        if store_kind == "sqlite":
            return SqliteStore(request.getfixturevalue("sqlite_path"))
        return EtcdStore(request.getfixturevalue("etcd_endpoints").split(","))

    stores = [open_one() for _ in range(8)]
    outcomes: list[str] = []
    barrier = threading.Barrier(len(stores))

    def add(i: int) -> None:
        barrier.wait()
        try:
            cidr = f"10.80.{i}.0/24" if i % 2 else "10.80.0.0/16"
            add_pool(stores[i], make_pool(f"p{i}", cidr))
            outcomes.append(f"p{i}")
        except AddressConflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=add, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        names = [v.name for v in list_pools(stores[0])]
        cidrs = [v.spec.cidr for v in list_pools(stores[0])]
        for i, a in enumerate(cidrs):  # whatever won, nothing overlaps
            assert not any(a.overlaps(b) for b in cidrs[i + 1 :]), names
        assert sorted(n for n in outcomes if n != "conflict") == sorted(names)
    finally:
        for s in stores:
            s.close()


def test_set_changes_mutable_settings_only(store):
    add_pool(store, make_pool("p", "10.60.0.0/24"))
    result = set_pool(
        store,
        "p",
        PoolUpdate(
            disabled=True,
            node_selector={"zone": "b"},
            add_exclusions=("10.60.0.9",),
            gateway="first",
            reuse_delay=30,
            strict_affinity=True,
        ),
    )
    assert {
        k: result.new[k]
        for k in (
            "disabled",
            "nodeSelector",
            "exclusions",
            "gateway",
            "reuseDelay",
            "strictAffinity",
        )
    } == {
        "disabled": True,
        "nodeSelector": {"zone": "b"},
        "exclusions": ["10.60.0.9/32"],
        "gateway": "first",
        "reuseDelay": 30,
        "strictAffinity": True,
    }
    assert record(store, f"{P}pools/p") == result.new
    again = set_pool(
        store,
        "p",
        PoolUpdate(
            remove_exclusions=("10.60.0.9/32",),
            node_selector={},
            cidr="10.60.0.0/24",
            block_size=26,
        ),
    )
    assert again.new["exclusions"] == [] and again.new["nodeSelector"] == {}
    with pytest.raises(PoolInvalid, match=r"cidr of pool p is immutable \(it is 10.60.0.0/24\)"):
        set_pool(store, "p", PoolUpdate(cidr="10.60.0.0/16"))
    with pytest.raises(PoolInvalid, match="blockSize of pool p is immutable"):
        set_pool(store, "p", PoolUpdate(block_size=28))
    with pytest.raises(PoolInvalid, match="exclusion 10.60.0.7 is not set"):
        set_pool(store, "p", PoolUpdate(remove_exclusions=("10.60.0.7",)))
    with pytest.raises(PoolInvalid, match="could ever be handed out"):
        set_pool(store, "p", PoolUpdate(add_exclusions=("10.60.0.0/24",)))
    with pytest.raises(PoolNotFound, match="pool nope does not exist"):
        set_pool(store, "nope", PoolUpdate(disabled=True))


def test_set_keeps_fields_it_does_not_know(store):
    c = Contents().pool("p", "10.60.0.0/24")
    c.records[f"{P}pools/p"]["futureField"] = {"x": 1}
    c.write(store)
    assert set_pool(store, "p", PoolUpdate(disabled=True)).new["futureField"] == {"x": 1}


def test_gateway_first_refused_when_a_block_gateway_is_held(store):
    c = Contents().pool("p", "10.60.0.0/24")
    c.allocate("p", "10.60.0.64", "net/c1/eth0")
    c.write(store)
    with pytest.raises(AddressConflict, match=r"10.60.0.64 \(net/c1/eth0\)"):
        set_pool(store, "p", PoolUpdate(gateway="first"))
    warned = set_pool(store, "p", PoolUpdate(add_exclusions=("10.60.0.64/30",)))
    assert warned.warnings == [
        "1 address(es) in the new exclusions stay held until released: 10.60.0.64"
    ]


def test_netconf_pool_takes_no_node_selector(store):
    c = Contents()
    name = c.netconf_pool("net", "10.70.0.0/24")
    name6 = c.netconf_pool("net", "fd70::/120")
    c.write(store)
    assert set_pool(store, name6, PoolUpdate(disabled=True)).new["disabled"] is True
    assert remove_pool(store, name6)["removed"] is True  # ':' in its name is fine
    with pytest.raises(PoolNotFound, match="invalid pool name 'a/b'"):
        remove_pool(store, "a/b")
    with pytest.raises(PoolInvalid, match="comes from the ranges of network net"):
        set_pool(store, name, PoolUpdate(node_selector={"a": "b"}))
    assert set_pool(store, name, PoolUpdate(disabled=True)).new["disabled"] is True


def test_rm_refuses_while_pods_hold_addresses_and_changes_nothing(store):
    c = Contents().pool("p", "10.60.0.0/24")
    c.allocate("p", "10.60.0.5", "net/c1/eth0").allocate("p", "10.60.0.70", "net/c2/eth0")
    c.write(store)
    before = {kv.key: kv.value for kv in store.range(P)}
    with pytest.raises(PoolInUse, match="pool p still has addresses in use") as info:
        remove_pool(store, "p")
    assert "2 handle(s) in 2 block(s): net/c1/eth0, net/c2/eth0" in info.value.details
    assert {kv.key: kv.value for kv in store.range(P)} == before


def test_rm_of_an_unused_pool_deletes_blocks_index_and_buffers(store):
    c = Contents().pool("p", "10.60.0.0/24").pool("q", "10.61.0.0/24")
    c.allocate("p", "10.60.0.5", "_buffer/node1/p")  # an outage buffer is no pod
    c.block("p", "10.60.0.64/26", "node2")
    c.allocate("q", "10.61.0.5", "net/c9/eth0")
    c.write(store)
    doc = remove_pool(store, "p")
    assert doc == {"pool": "p", "removed": True, "releasedAddresses": 1, "deletedBlocks": 2}
    keys = {kv.key for kv in store.range(P)}
    assert not any(k.startswith((f"{P}blocks/p/", f"{P}pools/p")) for k in keys)
    assert affinity_key("node2", "p", "10.60.0.64/26") not in keys
    assert record(store, f"{P}handles/_buffer/node1/p")["ips"] == []  # the buffer stays
    assert find_problems(read_snapshot(store)) == []
    assert record(store, block_key("q", "10.61.0.0/26"))["allocations"] == {
        "10.61.0.5": "net/c9/eth0"
    }


def test_rm_force_releases_every_address_and_strips_handles(store):
    c = Contents().pool("p", "10.60.0.0/24").pool("p6", "fd00:60::/120", block_size=122)
    c.allocate("p", "10.60.0.5", "net/c1/eth0").allocate("p6", "fd00:60::5", "net/c1/eth0")
    for i in range(10, 40):
        c.allocate("p", f"10.60.0.{i}", f"net/x{i}/eth0")
    c.write(store)
    doc = remove_pool(store, "p", force=True)
    assert (doc["releasedAddresses"], doc["deletedBlocks"]) == (31, 1)
    dual = record(store, f"{P}handles/net/c1/eth0")
    assert [ip["address"] for ip in dual["ips"]] == ["fd00:60::5/120"]  # its v6 stays
    assert record(store, f"{P}handles/net/x10/eth0") is None
    assert find_problems(read_snapshot(store)) == []
    with pytest.raises(PoolNotFound):
        remove_pool(store, "p")

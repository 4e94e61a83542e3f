"""gc's fixes and `release IP` on real stores (SQLite and etcd): each one CAS txn, re-checked."""

from __future__ import annotations

import json

import pytest

from cni.spec.errors import AddressConflict, InvalidConfig
from ipam.ops.check import find_problems
from ipam.ops.release import release_ip
from ipam.ops.repair import apply_fix, read_snapshot
from store.base import Put
from tests.fixtures.ipam_contents import Contents, affinity_key, block_key

P = "/pycni/v1/"
NOW = 1_700_000_000.0


def record(store, key: str) -> dict | None:
    kv = store.get(key)
    return json.loads(kv.value) if kv else None


def gc_rounds(store, rounds: int = 5) -> list[tuple[str, str, str]]:
    """What `pycni ipam gc` does: fix, look again, until nothing is left to fix."""
    done = []
    for _ in range(rounds):
        todo = [(f, x) for f in find_problems(read_snapshot(store)) for x in f.fixes]
        if not todo:
            break
        for finding, fix in todo:
            done.append((finding.kind, fix.action, apply_fix(store, fix, NOW)[0]))
    return done


@pytest.fixture
def broken(store) -> Contents:
    """A consistent cluster, then every kind of damage gc can repair."""
    c = Contents(now=NOW).pool("p", "10.1.0.0/24").pool("p6", "fd00:1::/120", block_size=122)
    c.allocate("p", "10.1.0.2", "net/c1/eth0").allocate("p6", "fd00:1::2", "net/c1/eth0")
    c.allocate("p", "10.1.0.3", "net/c2/eth0", node="node2", block_node="node1")
    c.allocate("p", "10.1.0.66", "net/c3/eth0", node="node2")
    c.list_in_handle("net/dup/eth0", "p", "10.1.0.2", node="node2")  # duplicate
    c.block("p", "10.1.0.0/26", "node1")["allocations"]["10.1.0.9"] = "net/gone/eth0"  # orphan
    c.list_in_handle("net/c3/eth0", "p", "10.1.0.70", node="node2")  # not-allocated
    c.list_in_handle("net/c4/eth0", "p", "10.1.0.130", node="node3")  # missing-block
    c.records[f"{P}handles/net/empty/eth0"] = {
        "network": "net",
        "containerID": "empty",
        "ifname": "eth0",
        "ips": [],
        "attributes": {},
    }
    c.block("gone", "10.9.0.0/26", "node1")  # orphan block
    del c.records[affinity_key("node2", "p", "10.1.0.64/26")]  # missing index
    c.records[affinity_key("node4", "p", "10.1.0.192/26")] = {"pool": "p"}  # stale index
    c.write(store)
    return c


def test_check_finds_every_injected_problem(store, broken):
    got = sorted((f.kind, f.ip or f.key) for f in find_problems(read_snapshot(store)))
    assert got == sorted(
        [
            ("duplicate-address", "10.1.0.2"),
            ("orphan-allocation", "10.1.0.9"),
            ("not-allocated", "10.1.0.70"),
            ("missing-block", "10.1.0.130"),
            ("orphan-handle", f"{P}handles/net/empty/eth0"),
            ("orphan-block", block_key("gone", "10.9.0.0/26")),
            ("missing-affinity", block_key("p", "10.1.0.64/26")),
            ("stale-affinity", affinity_key("node4", "p", "10.1.0.192/26")),
        ]
    )


def test_gc_repairs_everything_and_check_is_clean(store, broken):
    done = gc_rounds(store)
    assert sorted(a for _, a, status in done if status == "applied") == sorted(
        [
            "drop",
            "free",
            "restore",
            "restore",
            "delete-handle",
            "delete-block",
            "put-affinity",
            "delete-affinity",
        ]
    )
    assert find_problems(read_snapshot(store)) == []
    first = record(store, block_key("p", "10.1.0.0/26"))
    assert first["allocations"] == {"10.1.0.2": "net/c1/eth0", "10.1.0.3": "net/c2/eth0"}
    assert first["released"] == {"10.1.0.9": NOW}  # freed with its reuse delay
    assert record(store, f"{P}handles/net/dup/eth0") is None  # left with nothing: deleted
    assert (
        record(store, block_key("p", "10.1.0.64/26"))["allocations"]["10.1.0.70"] == "net/c3/eth0"
    )
    made = record(store, block_key("p", "10.1.0.128/26"))  # re-created for its handle's node
    assert (made["affinity"], made["allocations"]) == ("node3", {"10.1.0.130": "net/c4/eth0"})
    assert store.get(affinity_key("node3", "p", "10.1.0.128/26")) is not None
    assert store.get(block_key("gone", "10.9.0.0/26")) is None
    assert store.get(affinity_key("node1", "gone", "10.9.0.0/26")) is None
    assert gc_rounds(store) == []


def test_a_fix_whose_reason_is_gone_is_skipped(store, broken):
    snap = read_snapshot(store)
    (orphan,) = [f for f in find_problems(snap) if f.kind == "orphan-allocation"]
    # the handle appears between the check and the fix (e.g. a journal replay): keep it
    Contents(
        now=NOW, records={k: v for k, v in broken.records.items() if k.startswith(f"{P}pools/")}
    ).list_in_handle("net/gone/eth0", "p", "10.1.0.9").write(store)
    assert apply_fix(store, orphan.fixes[0], NOW) == (
        "skipped",
        "the allocation changed or its handle lists it now",
    )
    assert (
        record(store, block_key("p", "10.1.0.0/26"))["allocations"]["10.1.0.9"] == "net/gone/eth0"
    )


def test_a_fix_planned_on_a_stale_snapshot_rereads_and_keeps_the_new_state(store, broken):
    snap = read_snapshot(store)
    (orphan,) = [f for f in find_problems(snap) if f.kind == "orphan-allocation"]
    key = block_key("p", "10.1.0.0/26")
    block = record(store, key)
    block["allocations"]["10.1.0.50"] = "net/new/eth0"  # an ADD landing meanwhile
    assert store.txn([], [Put(key, json.dumps(block).encode())]).succeeded
    assert apply_fix(store, orphan.fixes[0], NOW)[0] == "applied"
    after = record(store, key)["allocations"]
    assert "10.1.0.9" not in after and after["10.1.0.50"] == "net/new/eth0"


def test_release_ip_frees_it_and_drops_it_from_its_handle(store):
    c = Contents(now=NOW).pool("p", "10.1.0.0/24").pool("p6", "fd00:1::/120", block_size=122)
    c.allocate("p", "10.1.0.2", "net/c1/eth0").allocate("p6", "fd00:1::2", "net/c1/eth0")
    c.allocate("p", "10.1.0.3", "net/c2/eth0", node="node2")
    c.block("p", "10.1.0.0/26", "node1")["borrowed"] = {"10.1.0.3": "node2"}
    c.write(store)
    doc = release_ip(store, "10.1.0.2", now=NOW)
    assert doc == {
        "ip": "10.1.0.2",
        "released": True,
        "pool": "p",
        "blockKey": block_key("p", "10.1.0.0/26"),
        "handles": ["net/c1/eth0"],
        "deletedHandles": [],
    }
    block = record(store, block_key("p", "10.1.0.0/26"))
    assert block["allocations"] == {"10.1.0.3": "net/c2/eth0"}
    assert block["released"] == {"10.1.0.2": NOW}
    assert [ip["address"] for ip in record(store, f"{P}handles/net/c1/eth0")["ips"]] == [
        "fd00:1::2/120"
    ]
    doc = release_ip(store, "10.1.0.3", now=NOW)
    assert doc["deletedHandles"] == ["net/c2/eth0"]
    block = record(store, block_key("p", "10.1.0.0/26"))
    assert block["allocations"] == {} and "borrowed" not in block and block["emptySince"] == NOW
    assert release_ip(store, "10.1.0.3") == {
        "ip": "10.1.0.3",
        "released": False,
        "reason": "no block or handle holds it",
    }
    assert find_problems(read_snapshot(store)) == []


def test_release_ip_of_an_orphan_allocation_or_handle_entry(store):
    c = Contents(now=NOW).pool("p", "10.1.0.0/24")
    c.block("p", "10.1.0.0/26", "node1")["allocations"]["10.1.0.9"] = "net/gone/eth0"
    c.list_in_handle("net/c5/eth0", "p", "10.1.0.20")
    c.write(store)
    assert release_ip(store, "10.1.0.9")["handles"] == ["net/gone/eth0"]
    assert release_ip(store, "10.1.0.20")["deletedHandles"] == ["net/c5/eth0"]
    assert find_problems(read_snapshot(store)) == []


def test_release_ip_needs_a_pool_when_networks_share_it(store):
    c = Contents(now=NOW)
    a, b = c.netconf_pool("neta", "10.9.0.0/24"), c.netconf_pool("netb", "10.9.0.0/24")
    c.allocate(a, "10.9.0.2", "neta/c1/eth0").allocate(b, "10.9.0.2", "netb/c2/eth0")
    c.write(store)
    with pytest.raises(AddressConflict, match=f"held in several pools: {a}, {b}"):
        release_ip(store, "10.9.0.2")
    assert release_ip(store, "10.9.0.2", pool=b)["handles"] == ["netb/c2/eth0"]
    assert record(store, f"{P}handles/neta/c1/eth0") is not None
    with pytest.raises(InvalidConfig, match="invalid address '10.9.0.2/24'"):
        release_ip(store, "10.9.0.2/24")


def test_a_fix_touching_a_malformed_record_is_skipped_not_fatal(store, broken):
    snap = read_snapshot(store)
    (orphan,) = [f for f in find_problems(snap) if f.kind == "orphan-allocation"]
    key = block_key("p", "10.1.0.0/26")
    block = {**record(store, key), "allocations": ["not", "a", "map"]}
    assert store.txn([], [Put(key, json.dumps(block).encode())]).succeeded
    status, why = apply_fix(store, orphan.fixes[0], NOW)
    assert status == "skipped" and "unusable" in why

"""The outage journal and buffer snapshot on disk, and the pure parts of the outage guard."""

from __future__ import annotations

import ipaddress

from ipam.alloc.allocator import Range
from ipam.alloc.selection import Selection
from ipam.outage.calc import calc_cancelled, calc_pool_names
from ipam.outage.files import OutageFiles
from ipam.records import LeasedIP


def entry(seq: int, op: str, cid: str) -> dict:
    return {"seq": seq, "op": op, "handle": {"network": "n", "containerID": cid, "ifname": "eth0"}}


def test_journal_appends_survive_a_reopen_and_rewrite_keeps_the_rest(tmp_path):
    files = OutageFiles(str(tmp_path), "node1")
    assert files.entries() == []
    for seq, op, cid in ((1, "add", "a"), (2, "add", "b"), (3, "del", "a")):
        files.append(entry(seq, op, cid))
    again = OutageFiles(str(tmp_path), "node1")
    assert [e["seq"] for e in again.entries()] == [1, 2, 3] and not again.corrupt
    again.rewrite([entry(2, "add", "b")])
    assert [e["seq"] for e in OutageFiles(str(tmp_path), "node1").entries()] == [2]
    again.rewrite([])
    assert OutageFiles(str(tmp_path), "node1").entries() == []


def test_a_torn_last_line_is_ignored_but_a_broken_middle_line_marks_the_journal(tmp_path):
    files = OutageFiles(str(tmp_path), "node1")
    files.append(entry(1, "add", "a"))
    with open(files.journal_path, "a") as fh:
        fh.write('{"seq": 2, "op": "ad')  # crash mid-append: that ADD was never answered
    assert [e["seq"] for e in files.entries()] == [1] and not files.corrupt
    with open(files.journal_path, "w") as fh:
        fh.write('{"seq": 1, "op": "add"}\nnot json\n{"seq": 3, "op": "del"}\n')
    broken = OutageFiles(str(tmp_path), "node1")
    assert [e["seq"] for e in broken.entries()] == [1, 3] and broken.corrupt


def test_buffer_snapshot_is_replaced_whole(tmp_path):
    files = OutageFiles(str(tmp_path), "node1")
    assert files.load_buffers() == {}
    ip = LeasedIP("10.0.0.5/24", None, "p", "10.0.0.0/26").to_dict()
    files.save_buffers({"p": [ip]})
    assert OutageFiles(str(tmp_path), "node1").load_buffers() == {"p": [ip]}
    with open(files.buffer_path, "w") as fh:
        fh.write("{broken")
    assert files.load_buffers() == {}


def test_an_add_followed_by_its_del_is_cancelled_but_not_a_later_add():
    batch = [
        entry(1, "add", "a"),
        entry(2, "add", "b"),
        entry(3, "del", "a"),
        entry(4, "add", "a"),
        entry(5, "del", "c"),
    ]
    assert calc_cancelled(batch) == {1}


def test_pool_names_for_an_outage_come_without_the_store():
    net = ipaddress.ip_network("10.1.0.0/24")
    rng = Range(net, net[1], net[-2], net[1])
    ranges = Selection("mynet", ((rng,),))
    assert calc_pool_names(ranges, {}) == (("mynet-10.1.0.0-24",),)
    v4 = [LeasedIP("10.2.0.9/16", None, "v4", "10.2.0.0/26")]
    v6 = [LeasedIP("fd00::9/64", None, "v6", "fd00::/122")]
    buffers = {"v6": v6, "v4": v4, "empty": []}
    assert calc_pool_names(Selection("n", pools=("v6", "v4")), buffers) == (("v4",), ("v6",))
    assert calc_pool_names(Selection("n"), buffers) == (("v4",), ("v6",))
    assert calc_pool_names(Selection("n", pools=("empty",)), buffers) == ((),)

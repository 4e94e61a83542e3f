"""The outage guard over a real etcd (no daemon, reconciler driven by hand): a journal
written back twice (a crash between the write-back and shortening the journal) changes nothing
the second time; an in-doubt ADD (committed, answer lost) merged with the buffer-served address
frees nothing; a corrupt journal disables the buffer rather than risk handing an address twice.
"""

from __future__ import annotations

import shutil
import time

import pytest

from cni.spec.errors import NotAvailable, TryAgainLater
from ipam.leases.service import LeaseService
from ipam.outage.files import OutageFiles
from ipam.outage.guard import OutageGuard
from ipam.outage.store import TrackedStore
from ipam.outage.txns import read_buffers
from ipam.records import BlockRecord, HandleId, HandleRecord
from plugins.ipam.config import parse_ipam_config
from store.etcd import EtcdStore
from store.keys import blocks_prefix

pytestmark = pytest.mark.etcd
CONF = {
    "cniVersion": "1.1.0",
    "name": "gnet",
    "type": "ptp",
    "ipam": {"type": "pycni-ipam", "ranges": [[{"subnet": "10.88.0.0/24"}]]},
}
POOL = "gnet-10.88.0.0-24"
SELECTION = parse_ipam_config(CONF).selection


@pytest.fixture
def guards(etcd_server, tmp_path):
    made: list[OutageGuard] = []

    def make() -> OutageGuard:
        store = TrackedStore(EtcdStore(etcd_server.endpoints, options={"requestTimeout": 0.5}))
        leases = LeaseService(store, "n1")
        guard = OutageGuard(leases, OutageFiles(str(tmp_path), "n1"), size=2, budget=1.0)
        made.append(guard.load())
        return guard

    yield make
    for guard in made:
        guard.store.close()


def add(guard: OutageGuard, cid: str) -> HandleRecord:
    handle = HandleId("gnet", cid, "eth0")
    return guard.acquire(
        handle, SELECTION, {}, lambda: guard.leases.acquire(handle, SELECTION, [], {})
    )[0]


def sync_until_up(guard: OutageGuard) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            return guard.sync()
        except (TryAgainLater, NotAvailable):  # status() says 50, other calls 11
            assert time.monotonic() < deadline, "etcd did not come back"
            time.sleep(0.2)


def holders(guard: OutageGuard) -> dict[str, str]:
    out: dict[str, str] = {}
    for kv in guard.store.range(blocks_prefix(POOL)):
        out.update(BlockRecord.from_bytes(kv.key, kv.value).allocations)
    return out


def test_a_journal_written_back_twice_changes_nothing_the_second_time(
    guards, etcd_server, tmp_path
):
    guard = guards()
    a = add(guard, "a")
    guard.sync()
    buffered = [ip.ip for ip in read_buffers(guard.store, "n1")[POOL].ips]
    assert len(buffered) == 2 and a.ips[0].ip not in buffered
    etcd_server.kill()
    b = add(guard, "b")  # the first call fails within the budget, then the buffer answers
    assert b.ips[0].ip == buffered[0] and guard.reach.suspect
    saved = str(tmp_path / "journal.copy")
    shutil.copy(guard.files.journal_path, saved)

    etcd_server.start()
    sync_until_up(guard)
    after_first = holders(guard)
    assert after_first[b.ips[0].ip] == "gnet/b/eth0" and not guard.entries

    shutil.copy(saved, guard.files.journal_path)  # as if pycnid died before shortening it
    again = guards()
    assert again.lookup(HandleId("gnet", "b", "eth0")) == b  # still served, idempotently
    assert add(again, "b") == b
    sync_until_up(again)
    assert again.conflicts.value() == 0 and not again.entries
    assert holders(again) == after_first
    assert add(again, "c").ips[0].ip not in after_first  # a fresh address, store path


def test_an_in_doubt_add_is_merged_with_the_served_address(guards, etcd_server):
    guard = guards()
    add(guard, "a")
    guard.sync()
    committed = guard.leases.acquire(HandleId("gnet", "x", "eth0"), SELECTION, [], {})[0]
    guard.known.clear()  # the answer was lost: the daemon never learnt the lease
    etcd_server.kill()
    served = add(guard, "x")
    assert served.ips != committed.ips
    etcd_server.start()
    sync_until_up(guard)
    record = guard.leases.lookup(HandleId("gnet", "x", "eth0"))
    assert sorted(ip.ip for ip in record.ips) == sorted(ip.ip for ip in served.ips + committed.ips)
    assert {holders(guard)[ip.ip] for ip in record.ips} == {"gnet/x/eth0"}


def test_a_corrupt_journal_disables_the_buffer(guards, etcd_server):
    guard = guards()
    add(guard, "a")
    guard.sync()
    with open(guard.files.journal_path, "w") as fh:
        fh.write("garbage\n")
    broken = guards()
    etcd_server.kill()
    with pytest.raises(TryAgainLater, match="no outage buffer address left"):
        add(broken, "b")

"""etcd outages under a real pycnid: ADDs served from the node's buffer (idempotent, CHECKable),
DELs journalled, code 11 within 3 s once the buffer is empty, STATUS 50; when etcd returns the
journal is written back, the buffer refilled and the store consistent; and a pycnid SIGKILLed
in the middle of the outage picks its journal up again: nothing lost, nothing handed out twice."""

from __future__ import annotations

import json
import os
from functools import partial

import pytest

from tests.cluster.checks import (
    assert_cli_checks_clean,
    assert_no_duplicates,
    assert_store_consistent,
    cli_check,
    store_view,
)
from tests.cluster.load import NETWORK, ipam, netconf
from tests.fixtures import waiting

pytestmark = [pytest.mark.netns, pytest.mark.etcd, pytest.mark.slow]
SIZE = 3
BUFFER = "_buffer/{node}/clusternet-10.96.0.0-20"


wait_for = partial(waiting.wait_for, step=0.2)  # probes here cost a store read or an exec


def buffer_of(cluster, node) -> list[str]:
    view = store_view(cluster)
    key = BUFFER.format(node=node.name)
    return view.handle_ips(key) if key in view.handles else []


def pods(view) -> dict[str, list[str]]:
    return {h.split("/")[1]: sorted(ips) for h, ips in view.pod_handles(NETWORK).items()}


def journal_lines(node) -> list[dict]:
    path = os.path.join(node.daemon.workdir, "ipam-outage", f"{node.name}.journal")
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_outage_served_from_the_buffer_written_back_and_refilled(make_cluster, cni_bin):
    cluster = make_cluster(nodes=1, ipam={"bufferSize": SIZE})
    node, etcd = cluster.nodes[0], cluster.etcd.members[0]
    conf = netconf()
    first = ipam(cni_bin, node, "ADD", conf, "a")
    assert first.ok, first.run.stdout
    reserved = set(
        wait_for("the buffer", lambda: len(b := buffer_of(cluster, node)) == SIZE and b, 10)
    )

    etcd.stop()
    assert ipam(cni_bin, node, "STATUS", conf).code == 50
    b = ipam(cni_bin, node, "ADD", conf, "b")
    c = ipam(cni_bin, node, "ADD", conf, "c")
    assert b.ok and c.ok, b.run.stdout + c.run.stdout
    assert b.seconds < 3 and c.seconds < 1  # known down after the first: no waiting at all
    again = ipam(cni_bin, node, "ADD", conf, "b")
    assert again.ok and again.ips() == b.ips()  # idempotent
    check_conf = {**conf, "prevResult": b.run.json}
    assert ipam(cni_bin, node, "CHECK", check_conf, "b").ok
    assert ipam(cni_bin, node, "DEL", conf, "c").ok  # journalled
    d = ipam(cni_bin, node, "ADD", conf, "d")
    assert d.ok and set(d.ips()) <= reserved and not set(d.ips()) & set(c.ips())
    e = ipam(cni_bin, node, "ADD", conf, "e")
    assert e.code == 11 and e.seconds < 3.0, (e.seconds, e.run.stdout)
    assert "outage buffer" in e.run.json["msg"]
    assert ipam(cni_bin, node, "STATUS", conf).code == 50
    assert [entry["op"] for entry in journal_lines(node)] == ["add", "add", "del", "add"]

    etcd.start()
    expected = {"a": sorted(first.ips()), "b": sorted(b.ips()), "d": sorted(d.ips())}
    view = wait_for("the write-back", lambda: pods(v := store_view(cluster)) == expected and v, 20)
    assert_store_consistent(view)
    assert view.allocations().get(c.ips()[0]) is None  # DELeted during the outage: free
    wait_for("the journal to empty", lambda: not journal_lines(node), 10)
    refilled = wait_for("the refill", lambda: len(b := buffer_of(cluster, node)) == SIZE and b, 10)
    assert not set(refilled) & {ip for ips in expected.values() for ip in ips}
    wait_for("STATUS", lambda: ipam(cni_bin, node, "STATUS", conf).ok, 10)
    e = ipam(cni_bin, node, "ADD", conf, "e")
    assert e.ok, e.run.stdout
    assert_no_duplicates([first, b, d, e])
    assert_store_consistent(store_view(cluster))
    assert_cli_checks_clean([cli_check(cluster, "after the write-back")])


def test_pycnid_sigkilled_mid_outage_replays_its_journal(make_cluster, cni_bin):
    cluster = make_cluster(nodes=1, ipam={"bufferSize": 4})
    node, etcd = cluster.nodes[0], cluster.etcd.members[0]
    conf = netconf()
    first = ipam(cni_bin, node, "ADD", conf, "a")
    assert first.ok
    reserved = set(
        wait_for("the buffer", lambda: len(b := buffer_of(cluster, node)) == 4 and b, 10)
    )
    etcd.stop()
    b = ipam(cni_bin, node, "ADD", conf, "b")
    c = ipam(cni_bin, node, "ADD", conf, "c")
    assert b.ok and c.ok

    node.daemon.kill()
    node.daemon.start()  # etcd still down: starts, and finds its journal
    again = ipam(cni_bin, node, "ADD", conf, "b")
    assert again.ok and again.ips() == b.ips()
    d = ipam(cni_bin, node, "ADD", conf, "d")
    assert d.ok, d.run.stdout + node.daemon.log()[-3000:]
    assert set(d.ips()) <= reserved and not set(d.ips()) & set(b.ips() + c.ips())
    assert ipam(cni_bin, node, "DEL", conf, "c").ok
    node.daemon.kill()  # and once more, with a DEL in the journal
    node.daemon.start()

    etcd.start()
    expected = {"a": sorted(first.ips()), "b": sorted(b.ips()), "d": sorted(d.ips())}
    view = wait_for("the write-back", lambda: pods(v := store_view(cluster)) == expected and v, 20)
    assert_store_consistent(view)
    assert_no_duplicates([first, b, d])
    held = view.allocations()
    assert held.get(c.ips()[0]) is None
    assert all(held[ip] == f"{NETWORK}/{cid}/eth0" for cid, ips in expected.items() for ip in ips)
    wait_for("the journal to empty", lambda: not journal_lines(node), 10)
    e = ipam(cni_bin, node, "ADD", conf, "e")  # a netconf pool is known again from an ADD
    assert e.ok and not set(e.ips()) & set(held)
    wait_for("the refill", lambda: len(buffer_of(cluster, node)) == 4, 10)
    assert_store_consistent(store_view(cluster))
    assert_cli_checks_clean([cli_check(cluster, "after the write-back")])

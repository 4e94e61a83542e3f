"""The enforcement's inputs: the config section, the store records as PolicyInputs, and the
br_netfilter check (netpol/config.py, netpol/view.py, netpol/sync.py)."""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path
from typing import cast

import pytest

from cni.spec.errors import InvalidConfig, TryAgainLater
from common.metrics import Registry
from kernel.nft import Nft
from kube.api import Api
from kube.config import KubeConfig
from kube.source import KubeSource
from netpol import sync as netpol_sync
from netpol.config import NetpolConfig, parse_netpol_config
from netpol.evaluate import PodInfo, PolicyInputs
from netpol.policy import parse_policy
from netpol.purge import calc_denied, parse_flows
from netpol.render import Layout
from netpol.sync import BRIDGE_SYSCTLS, NetpolSync, check_bridge_filtering
from netpol.view import Records
from nodes.record import NodeRecord, node_key
from services.record import EndpointRecord
from store.base import KV, Put
from store.codec import encode
from store.keys import NETPOLS, namespace_key, netpol_key
from store.sqlite import SqliteStore
from tests.fixtures.waiting import wait_for

POLICY = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"namespace": "x", "name": "deny"},
    "spec": {"podSelector": {}},
}


def kv(key: str, value: bytes) -> KV:
    return KV(key, value, 1, 1)


def test_config_section() -> None:
    assert parse_netpol_config({}) is None
    assert parse_netpol_config({"networkPolicy": {}}) is None
    assert parse_netpol_config({"networkPolicy": {"enforce": True}}) == NetpolConfig()
    got = parse_netpol_config({"networkPolicy": {"enforce": True, "resyncInterval": 5}})
    assert got == NetpolConfig(5.0)
    purge = {"enforce": True, "existingConnections": "purge"}
    assert parse_netpol_config({"networkPolicy": purge}) == NetpolConfig(purge=True)
    bads: list[object] = [
        {"enforce": "yes"},
        {"resyncInterval": 0},
        {"enforce": True, "x": 1},
        {"enforce": True, "existingConnections": "cut"},
        [],
    ]
    for bad in bads:
        with pytest.raises(InvalidConfig, match="networkPolicy"):
            parse_netpol_config({"networkPolicy": bad})


def test_records_become_policy_inputs() -> None:
    records = Records()
    endpoint = EndpointRecord(
        "x", "a", "eth0", ("10.0.0.2",), {"pod": "a"}, "n1", {"web": 80, "dns": 53},
        port_protocols={"dns": "UDP"},
    )  # fmt: skip
    records.replace_all([kv(netpol_key("x", "deny"), encode(POLICY))], NETPOLS)
    records.apply(kv(endpoint.key, endpoint.to_bytes()))
    records.apply(kv(namespace_key("x"), encode({"labels": {"team": "x"}})))
    records.apply(kv(node_key("n1"), NodeRecord("n1", "172.31.0.1").to_bytes()))
    records.apply(kv(netpol_key("x", "bad"), b'{"kind": "nope"}'))  # logged, left out
    got = records.inputs()
    assert got.policies == (parse_policy(POLICY),)
    [pod] = got.pods
    assert (pod.ref, pod.ips, pod.node) == ("x/a", ("10.0.0.2",), "n1")
    assert pod.resolve("dns", "UDP") == 53 and pod.resolve("web", "TCP") == 80
    assert pod.resolve("dns", "TCP") is None
    assert got.namespace_labels("x") == {"team": "x", "kubernetes.io/metadata.name": "x"}
    assert got.node_ips == {"n1": ("172.31.0.1",)}
    version = records.version
    records.apply(kv(endpoint.key, endpoint.to_bytes()))  # unchanged: no new render
    assert records.version == version
    records.apply(kv(netpol_key("x", "deny"), b""), deleted=True)
    assert records.inputs().policies == () and records.version > version


def test_bridge_filtering_check_names_each_sysctl_that_is_off() -> None:
    values = {BRIDGE_SYSCTLS[0]: "1\n", BRIDGE_SYSCTLS[1]: "0\n"}
    none: dict[str, str] = {}
    assert check_bridge_filtering(None, values.get) == [BRIDGE_SYSCTLS[1]]
    assert check_bridge_filtering(None, none.get) == list(BRIDGE_SYSCTLS)  # no br_netfilter
    assert check_bridge_filtering(None, lambda _name: "1") == []


def test_settle_waits_for_a_pass_that_began_after_it(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "store.db"))
    sync = NetpolSync("n1", store, Registry(), local_addresses=lambda: ())  # no kernel
    endpoint = EndpointRecord("x", "a", "eth0", ("10.0.0.2",), {}, "n1")
    with pytest.raises(TryAgainLater):  # no pass ran: the ADD is told to try again
        sync.settle(endpoint.key, endpoint.to_bytes(), timeout=0.05)
    assert [p.ref for p in sync.records.inputs().pods] == ["x/a"]  # in the view at once
    timer = threading.Timer(0.05, sync.step)
    timer.start()
    sync.settle(endpoint.key, endpoint.to_bytes(), timeout=5)
    timer.join()
    assert sync.ok_through == 1
    store.close()


def test_settle_under_the_kubernetes_source_waits_for_nothing(tmp_path: Path) -> None:
    """The Pod object, not pycni-svc's record, is the input then: an ADD is not held up (and
    not told to try again) for a pass that could not program it."""
    store = SqliteStore(str(tmp_path / "store.db"))
    source = KubeSource(cast(Api, None), KubeConfig(), Registry())  # never started: no I/O
    sync = NetpolSync("n1", store, Registry(), local_addresses=lambda: (), kube=source)
    endpoint = EndpointRecord("x", "a", "eth0", ("10.0.0.2",), {}, "n1")
    sync.settle(endpoint.key, endpoint.to_bytes(), timeout=0.05)  # no pass ran: no error
    assert sync.started == 0 and set(source.status()) == {"pods", "namespaces", "networkpolicies"}
    store.close()


LISTING = """\
tcp      6 431999 ESTABLISHED src=10.22.0.9 dst=10.96.0.10 sport=40000 dport=80 \
src=10.22.0.2 dst=10.22.0.9 sport=8080 dport=40000 [ASSURED] mark=0 use=1
udp      17 28 src=10.22.0.9 dst=10.22.0.3 sport=5000 dport=53 src=10.22.0.3 dst=10.22.0.9 \
sport=53 dport=5000 mark=0 use=1
tcp      6 119 TIME_WAIT src=10.22.0.9 dst=10.22.0.2 sport=40001 dport=80 \
src=10.22.0.2 dst=10.22.0.9 sport=80 dport=40001 [ASSURED] mark=0 use=1
udp      17 29 src=10.22.0.9 dst=10.22.0.2 sport=5001 dport=80 [UNREPLIED] src=10.22.0.2 \
dst=10.22.0.9 sport=80 dport=5001 mark=0 use=1
icmp     1 29 src=10.22.0.9 dst=10.22.0.2 type=8 code=0 id=1 src=10.22.0.2 dst=10.22.0.9 \
type=0 code=0 id=1 mark=0 use=1
"""


def test_purge_judges_each_flow_after_dnat_and_deletes_only_denied_ones() -> None:
    flows = parse_flows(LISTING)
    assert [(f.protocol, f.dst, f.backend, f.backend_port) for f in flows] == [
        ("tcp", "10.96.0.10", "10.22.0.2", 8080),  # a ClusterIP: judged at its backend
        ("udp", "10.22.0.3", "10.22.0.3", 53),
    ]
    pods = (
        PodInfo("x", "a", ("10.22.0.2",), {"app": "web"}, "n1"),
        PodInfo("x", "b", ("10.22.0.3",), {"app": "dns"}, "n1"),
        PodInfo("y", "c", ("10.22.0.9",), {}, "n2"),
    )
    deny_web = parse_policy({**POLICY, "spec": {"podSelector": {"matchLabels": {"app": "web"}}}})
    inputs = PolicyInputs(pods, {}, (deny_web,))
    assert calc_denied(inputs, "n1", flows) == [flows[0]]
    assert calc_denied(inputs, "n2", flows) == []  # neither end is n2's: its node judges
    assert flows[0].delete_args()[:3] == ["-D", "-p", "tcp"]


def test_the_netns_addresses_are_read_once_a_second_and_at_a_resync(tmp_path: Path) -> None:
    reads: list[int] = []

    def local() -> tuple[str, ...]:
        reads.append(1)
        return ("10.0.0.1",)

    store = SqliteStore(str(tmp_path / "store.db"))
    sync = NetpolSync("n1", store, Registry(), node_address="172.31.0.1", local_addresses=local)
    assert sync.calc_node_addresses() == ("172.31.0.1", "10.0.0.1")
    assert sync.calc_node_addresses() == ("172.31.0.1", "10.0.0.1") and len(reads) == 1
    sync.full_due = 0.0  # a resync is due: the pass reads them again
    sync.step()
    assert len(reads) == 2
    store.close()


def test_the_counters_loop_keeps_the_addresses_and_wakes_a_pass_when_they_change(
    tmp_path: Path,
) -> None:
    """After the first pass read them, the netns' addresses are read off the pass's path, by
    the counters' loop every LOCAL_ADDRESSES seconds: a change wakes a pass, which uses it."""
    found = [("10.0.0.1",)]
    store = SqliteStore(str(tmp_path / "store.db"))
    sync = NetpolSync("n1", store, Registry(), local_addresses=lambda: found[-1])
    assert sync.calc_node_addresses() == ("10.0.0.1",)
    sync.wake.clear()
    sync.local_due = 1.0  # due: read, the same
    sync.step_counters()
    assert not sync.wake.is_set() and sync.local_due > 1.0
    found.append(("10.0.0.2",))
    sync.local_due = 1.0
    sync.step_counters()
    assert sync.wake.is_set() and sync.calc_node_addresses() == ("10.0.0.2",)
    store.close()


class FakeNft:
    """The kernel side of a NetpolSync that takes every transaction (no netns needed)."""

    def __init__(self) -> None:
        self.sent: list[object] = []

    def list_json(self, command: str, terse: bool = False) -> dict:
        return {"nftables": []}

    def counters(self, family: str, table: str) -> dict[str, tuple[int, int]]:
        return {}

    def run(self, script: str) -> None:
        self.sent.append(script)

    run_apart = run

    def run_elements(self, batch: object) -> None:
        self.sent.append(batch)

    def run_then_elements(self, script: str, make) -> None:
        self.run(script)
        self.run_elements(make())

    def release_cache(self) -> None:
        """Nothing kept: no cache to give back."""


def deny_all_in_x(tmp_path: Path) -> tuple[SqliteStore, NetpolSync]:
    """A store with policy x/deny (every Pod of x isolated, nothing allowed) and a sync of
    node n1 over it, its kernel faked."""
    store = SqliteStore(str(tmp_path / "store.db"))
    deny = parse_policy(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"namespace": "x", "name": "deny"},
            "spec": {"podSelector": {}},
        }
    )
    store.txn([], [Put(netpol_key("x", "deny"), encode(deny.to_dict()))])
    sync = NetpolSync("n1", store, Registry(), local_addresses=lambda: ())
    sync.nft = cast(Nft, FakeNft())
    return store, sync


def test_a_pod_isolated_at_once_stays_isolated_through_a_pass_that_read_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """x/b's ADD comes while a pass computes its layout from inputs read before x/b: the ADD
    isolates x/b at once (x/a made the chain of its policy), and the pass commits its layout
    with x/b's entries laid over it (pins), not without them; a later pass reads x/b itself
    and the pins go."""
    store, sync = deny_all_in_x(tmp_path)
    a = EndpointRecord("x", "a", "eth0", ("10.0.0.2",), {}, "n1")
    b = EndpointRecord("x", "b", "eth0", ("10.0.0.3",), {}, "n1")
    store.txn([], [Put(a.key, a.to_bytes())])  # pycni-svc writes the record, then settles
    timer = threading.Timer(0.05, sync.step)  # x/a: the first Pod of its policies, a pass
    timer.start()
    sync.settle(a.key, a.to_bytes(), timeout=5)
    timer.join()
    assert sync.metrics.at_once.value() == 0
    real = netpol_sync.calc_layout

    def layout_while_b_comes(*args: object, **kw: object) -> Layout:
        store.txn([], [Put(b.key, b.to_bytes())])
        sync.settle(b.key, b.to_bytes(), timeout=0.01)  # at once, or TryAgainLater
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(netpol_sync, "calc_layout", layout_while_b_comes)
    sync.step()
    monkeypatch.setattr(netpol_sync, "calc_layout", real)
    assert sync.metrics.at_once.value() == 1
    assert sync.layout is not None
    assert "10.0.0.3 : jump " in " ".join(sync.layout.sets["ingress4"].elements)
    assert sync.pins
    time.sleep(netpol_sync.AFTER_ADD)  # the pass x/b's ADD put off (``put_off_pass``)
    sync.step()
    assert not sync.pins and "10.0.0.3 : jump " in " ".join(sync.layout.sets["ingress4"].elements)
    store.close()


def test_the_pass_after_an_add_isolated_at_once_waits_for_the_add_to_answer(
    tmp_path: Path,
) -> None:
    """x/b isolated at once (x/a made its chain): the pass that adds the rest does not begin
    within ``AFTER_ADD`` (a step then is no pass, and says how long to wait), then does; an
    ADD that waits for a pass (``wait_pass``) is never put off."""
    store, sync = deny_all_in_x(tmp_path)
    a = EndpointRecord("x", "a", "eth0", ("10.0.0.2",), {}, "n1")
    b = EndpointRecord("x", "b", "eth0", ("10.0.0.3",), {}, "n1")
    for record in (a, b):
        store.txn([], [Put(record.key, record.to_bytes())])
    sync.step()  # x/a and x/b in the kernel: the chain of x's policies exists
    c = EndpointRecord("x", "c", "eth0", ("10.0.0.4",), {}, "n1")
    store.txn([], [Put(c.key, c.to_bytes())])
    started = sync.started
    sync.settle(c.key, c.to_bytes(), timeout=0.01)
    assert sync.metrics.at_once.value() == 1 and sync.wake.is_set()
    wait = sync.step()
    assert 0 < wait <= netpol_sync.AFTER_ADD and sync.started == started
    time.sleep(wait)
    sync.step()
    assert sync.started == started + 1 and not sync.pins
    d = EndpointRecord("x", "d", "eth0", ("10.0.0.5",), {}, "n1")
    store.txn([], [Put(d.key, d.to_bytes())])
    sync.settle(d.key, d.to_bytes(), timeout=0.01)  # put off again
    assert sync.put_off is not None
    waiting = threading.Thread(target=sync.wait_pass, args=(5.0, "a waiting ADD"))
    waiting.start()
    wait_for("wait_pass to call the put-off pass back", lambda: sync.put_off is None, 5)
    sync.step()  # at once: a pass, not a wait
    waiting.join(5)
    assert not waiting.is_alive() and sync.started == started + 2
    store.close()


def test_a_pass_runs_with_the_collector_paused_and_then_freezes_the_heap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collections a pass makes due run after it (a full one took 64 ms inside a pass at
    10k Pods): its layout and its transaction see the collector off, and it is on again
    after. Once the pass's ADDs were released (``passed``), a whole render freezes what is
    alive after a collection (``common.collector.freeze_heap``) and a diff what it made
    without one (``freeze_young``): here counted rather than run, as freezing the test
    process would hide its garbage."""
    store, sync = deny_all_in_x(tmp_path)
    seen: list[tuple[str, bool]] = []
    events: list[str] = []
    real_layout = netpol_sync.calc_layout
    nft = cast(FakeNft, sync.nft)
    real_run, real_elements, real_passed = nft.run, nft.run_elements, sync.passed

    def layout(*args, **kwargs):
        seen.append(("layout", gc.isenabled()))
        return real_layout(*args, **kwargs)

    def run(script: str) -> None:
        seen.append(("nft", gc.isenabled()))
        real_run(script)

    def run_elements(batch: object) -> None:
        seen.append(("nft", gc.isenabled()))
        real_elements(batch)

    def passed() -> None:
        events.append("passed")
        real_passed()

    monkeypatch.setattr(netpol_sync, "calc_layout", layout)
    monkeypatch.setattr(netpol_sync, "freeze_heap", lambda: events.append("whole"))
    monkeypatch.setattr(netpol_sync, "freeze_young", lambda: events.append("young"))
    monkeypatch.setattr(sync, "passed", passed)
    monkeypatch.setattr(nft, "run", run)
    monkeypatch.setattr(nft, "run_apart", run)
    monkeypatch.setattr(nft, "run_elements", run_elements)
    assert gc.isenabled()
    a = EndpointRecord("x", "a", "eth0", ("10.0.0.2",), {}, "n1")
    store.txn([], [Put(a.key, a.to_bytes())])
    sync.step()  # the first pass: the table whole
    assert events[:2] == ["passed", "whole"] and "young" not in events and nft.sent
    first, sent = len(events), len(nft.sent)
    b = EndpointRecord("x", "b", "eth0", ("10.0.0.3",), {}, "n1")
    store.txn([], [Put(b.key, b.to_bytes())])
    wait_for("a pass isolating x/b", lambda: sync.step() >= 0 and len(nft.sent) > sent, 5)
    assert sync.layout is not None and "10.0.0.3" in repr(sync.layout.sets)  # a diff
    later = events[first:]  # the diff's pass: released, then its new objects frozen
    assert later[0] == "passed" and later.count("young") == 1 and "whole" not in later, events
    assert {what for what, _ in seen} == {"layout", "nft"}
    assert all(not enabled for _, enabled in seen), seen
    assert gc.isenabled()
    store.close()

"""Per-element updates of the pycni-netpol table: ``render_diff``'s order (netpol/diff.py) and
the sync's choice between a diff and a full render (netpol/sync.py), against a recording nft.
That a diff leaves the kernel where a full render does is tested in real netns
(tests/netns/test_netpol_diff.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.metrics import Registry
from kernel.nft import NftError
from kernel.nftelem import (
    COUNTER,
    VERDICT,
    CounterChange,
    ElementBatch,
    Removal,
    SetType,
    render_script,
)
from netpol.diff import NotDiffable, calc_element_batch, render_diff
from netpol.evaluate import PodInfo, PolicyInputs
from netpol.policy import parse_policy
from netpol.render import Layout, NamedSet, calc_layout
from netpol.sync import COUNTERS, COUNTERS_AFTER, LOCAL_ADDRESSES, NetpolSync
from services.record import EndpointRecord
from store.base import KV
from store.codec import encode
from store.keys import netpol_key
from store.sqlite import SqliteStore

DENY = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"namespace": "x", "name": "deny"},
    "spec": {"podSelector": {}},
}
WEB = {"podSelector": {"matchLabels": {"app": "web"}}}
FROM_WEB = {
    **DENY,
    "metadata": {"namespace": "x", "name": "from-web"},
    "spec": {"podSelector": {}, "ingress": [{"from": [WEB]}]},
}


def pod(name: str, ip: str, **labels: str) -> PodInfo:
    return PodInfo("x", name, (ip,), labels, "n1")


def layout_of(*pods: PodInfo, policies: tuple[dict[str, Any], ...] = (FROM_WEB,)) -> Layout:
    parsed = tuple(parse_policy(p) for p in policies)
    return calc_layout(PolicyInputs(pods, {}, parsed), "n1")


def test_the_same_layout_is_no_transaction() -> None:
    pods = (pod("a", "10.0.0.1", app="web"), pod("b", "10.0.0.2"))
    assert render_diff(layout_of(*pods), layout_of(*pods)) == ""


def test_interval_elements_are_deleted_before_the_merged_interval_is_added() -> None:
    """An interval set refuses an interval overlapping one still there (nft: "interval
    overlaps with an existing one"), even one the same transaction deletes later."""
    spread, joined = Layout(), Layout()
    spread.sets["blocks4-x"] = NamedSet(
        "blocks4-x", "set", "ipv4_addr", True, ("10.0.0.1", "10.0.0.3")
    )
    joined.sets["blocks4-x"] = NamedSet(
        "blocks4-x", "set", "ipv4_addr", True, ("10.0.0.1-10.0.0.3",)
    )
    assert render_diff(spread, joined).splitlines() == [
        "delete element inet pycni-netpol blocks4-x { 10.0.0.1, 10.0.0.3 }",
        "add element inet pycni-netpol blocks4-x { 10.0.0.1-10.0.0.3 }",
    ]


def test_a_chain_whose_rule_lost_its_set_is_refilled_and_gone_objects_go_last() -> None:
    with_web = layout_of(pod("a", "10.0.0.1", app="web"), pod("b", "10.0.0.2"))
    without = layout_of(pod("a", "10.0.0.1"), pod("b", "10.0.0.2"))
    [chain] = without.chains
    lines = render_diff(with_web, without).splitlines()
    assert f"flush chain inet pycni-netpol {chain}" in lines  # same name, fewer rules
    [peers] = [n for n in with_web.sets if n.startswith("pods4-")]
    assert lines[-1] == f"delete set inet pycni-netpol {peers}"  # after the rule naming it
    gone = render_diff(with_web, layout_of(pod("b", "10.0.0.2"), policies=())).splitlines()
    kinds = [line.split()[1] for line in gone if line.startswith(("delete chain", "delete set"))]
    assert kinds == sorted(kinds)  # chains, then the sets they named
    assert gone[-1] == "delete counter inet pycni-netpol dropped-in/x/b"
    unmapped = gone.index("delete element inet pycni-netpol ingress4 { 10.0.0.1, 10.0.0.2 }")
    assert unmapped < gone.index(f"delete chain inet pycni-netpol {chain}")  # no jump to it


def test_elements_alone_of_plain_sets_are_a_netlink_batch_deletes_first() -> None:
    before = layout_of(pod("a", "10.0.0.1", app="web"), pod("b", "10.0.0.2"))
    after = layout_of(pod("a", "10.0.0.1"), pod("b", "10.0.0.2", app="web"))  # same chain
    batch = calc_element_batch(before, after)
    assert batch is not None and (batch.family, batch.table) == ("inet", "pycni-netpol")
    [name] = {c.set for c in batch.changes}
    assert name.startswith("pods4-") and batch.changes[0].type == SetType(("ipv4_addr",))
    assert [(c.verb, c.elements) for c in batch.changes] == [
        ("delete", (("10.0.0.1", None),)),
        ("add", (("10.0.0.2", None),)),
    ]
    assert calc_element_batch(before, before) is None  # nothing to send


def test_a_batch_carries_map_values_and_counters_never_chains_or_intervals() -> None:
    only_a = layout_of(pod("a", "10.0.0.1", app="web"), policies=(DENY,))
    both = layout_of(pod("a", "10.0.0.1", app="web"), pod("b", "10.0.0.2"), policies=(DENY,))
    batch = calc_element_batch(only_a, both)  # b isolated in a's chain: its entries, a counter
    assert batch is not None
    assert batch.counters == (CounterChange("add", "dropped-in/x/b"),)
    back = calc_element_batch(both, only_a)
    assert back is not None and back.counters == (CounterChange("delete", "dropped-in/x/b"),)
    types = {c.set: c.type for c in batch.changes}
    assert types["ingress4"] == SetType(("ipv4_addr",), VERDICT)
    assert types["dropcnt-in4"] == SetType(("ipv4_addr",), COUNTER)
    assert types["self4"] == SetType(("ipv4_addr", "ipv4_addr"))
    moved = layout_of(pod("a", "10.0.0.1", app="web"), policies=(DENY,))
    moved.sets["node4"] = NamedSet("node4", "set", "ipv4_addr", True, ("192.168.0.1",))
    assert calc_element_batch(only_a, moved) is None  # an interval set: nft's script


def test_a_pod_leaving_a_chain_it_was_alone_in_is_one_batch_with_the_chain_and_its_sets() -> None:
    """b was the one Pod isolated by ``from-web`` (its chain, its peers' set): unselected,
    its entries, its counter, the chain and the set go in one batch, as nft's script orders
    them; a Pod newly isolated in a chain the kernel lacks still needs the script."""
    selects_b = {
        **FROM_WEB,
        "spec": {**FROM_WEB["spec"], "podSelector": {"matchLabels": {"x": "b"}}},
    }
    alone = layout_of(
        pod("a", "10.0.0.1", app="web"), pod("b", "10.0.0.2", x="b"), policies=(selects_b,)
    )
    left = layout_of(pod("a", "10.0.0.1", app="web"), pod("b", "10.0.0.2"), policies=(selects_b,))
    [chain] = alone.chains
    [peers] = [n for n in alone.sets if n.startswith("pods4-")]
    batch = calc_element_batch(alone, left)
    assert batch is not None and not left.chains and peers not in left.sets
    assert batch.removals == (Removal("chain", chain), Removal("set", peers))
    assert batch.counters == (CounterChange("delete", "dropped-in/x/b"),)
    assert render_script(batch).splitlines()[-4:] == [
        f"flush chain inet pycni-netpol {chain}",
        f"delete chain inet pycni-netpol {chain}",
        f"delete set inet pycni-netpol {peers}",
        "delete counter inet pycni-netpol dropped-in/x/b",
    ]
    assert calc_element_batch(left, alone) is None  # a chain to make: rules are nft's script


def test_a_set_that_changed_its_declaration_is_not_diffable() -> None:
    old = layout_of(pod("a", "10.0.0.1"))
    new = layout_of(pod("a", "10.0.0.1"))
    node4 = new.sets["node4"]
    new.sets["node4"] = NamedSet("node4", "set", node4.type, False, ())
    with pytest.raises(NotDiffable, match="node4"):
        render_diff(old, new)
    with pytest.raises(NotDiffable, match="node4"):  # the batch, asked first, says so too
        calc_element_batch(old, new)


class RecordingNft:
    """The scripts a sync sent, refusing the next ``refuse`` of them (none listed)."""

    def __init__(self) -> None:
        self.scripts: list[str] = []
        self.batches: list[ElementBatch] = []
        self.listings: list[str] = []
        self.refuse = 0
        self.released = 0  # release_cache calls: after whole renders only

    def run(self, script: str) -> None:
        self.scripts.append(script)
        if self.refuse:
            self.refuse -= 1
            raise NftError("Error: Could not process rule: Device or resource busy")

    run_apart = run

    def run_elements(self, batch: ElementBatch) -> None:
        self.batches.append(batch)
        if self.refuse:
            self.refuse -= 1
            raise NftError("element batch refused: Device or resource busy")

    def run_then_elements(self, script: str, make) -> None:
        """As the real engine: the batch is not made or sent when the script is refused."""
        self.run(script)
        self.run_elements(make())

    def list_json(self, command: str, terse: bool = False) -> dict[str, Any]:
        return {"nftables": []}

    def release_cache(self) -> None:
        self.released += 1

    def counters(self, family: str, table: str) -> dict[str, tuple[int, int]]:
        self.listings.append(f"counters of {family} {table}")
        return {"dropped-in/x/a": (7, 420), "dropped-eg/x/a": (2, 80), "other": (5, 5)}


@pytest.fixture
def sync(tmp_path: Path) -> Iterator[tuple[NetpolSync, RecordingNft]]:
    store = SqliteStore(str(tmp_path / "store.db"))
    made = NetpolSync("n1", store, Registry(), local_addresses=lambda: ())
    nft = made.nft = RecordingNft()  # type: ignore[assignment]
    made.records.apply(KV(netpol_key("x", "deny"), encode(DENY), 1, 1))
    yield made, nft
    store.close()


def add_endpoint(sync: NetpolSync, name: str, ip: str, **labels: str) -> None:
    endpoint = EndpointRecord("x", name, "eth0", (ip,), labels, "n1")
    sync.records.apply(KV(endpoint.key, endpoint.to_bytes(), 1, 1))


def test_a_pass_without_change_sends_nothing_and_a_change_only_its_diff(
    sync: tuple[NetpolSync, RecordingNft],
) -> None:
    netpol, nft = sync
    add_endpoint(netpol, "a", "10.0.0.1")
    how = netpol.sync()
    assert how == "rendered"
    assert nft.scripts[0].startswith("add table inet pycni-netpol\nflush table")
    netpol.settle_heap(how)  # as the loop does once the pass's ADDs were released
    assert nft.released == 1  # a whole render's cache and heap given back
    assert not netpol.sync() and len(nft.scripts) == 1
    add_endpoint(netpol, "b", "10.0.0.2")  # isolated in a's chain: entries and a counter
    assert netpol.sync() and len(nft.scripts) == 1
    [_first, batch] = nft.batches  # the first render's elements, then the diff
    entries = dict(e.split(" : ") for e in netpol.layout.sets["ingress4"].elements)
    assert entries["10.0.0.2"] == entries["10.0.0.1"]  # a's chain
    assert ("10.0.0.2", entries["10.0.0.1"]) in [e for c in batch.changes for e in c.elements]
    assert [c.name for c in batch.counters] == ["dropped-in/x/b"]
    netpol.records.apply(KV(netpol_key("x", "from-web"), encode(FROM_WEB), 1, 1))
    assert netpol.sync()  # a new chain whose rules kernel/nftrule.py takes: the batch's
    assert len(nft.scripts) == 1 and [c.name[:3] for c in nft.batches[-1].chains] == ["in-"]
    [chain] = nft.batches[-1].chains
    assert chain.rules == tuple(netpol.layout.chains[chain.name]) and len(
        chain.expressions
    ) == len(chain.rules)
    assert netpol.metrics.syncs.value() == 3 and nft.released == 1  # updates keep the cache


def test_a_change_of_elements_alone_is_sent_as_a_batch(
    sync: tuple[NetpolSync, RecordingNft],
) -> None:
    netpol, nft = sync
    netpol.records.apply(KV(netpol_key("x", "from-web"), encode(FROM_WEB), 1, 1))
    add_endpoint(netpol, "a", "10.0.0.1", app="web")
    add_endpoint(netpol, "b", "10.0.0.2")
    netpol.sync()
    [first] = nft.batches  # the first render's plain elements, after its script
    assert {c.verb for c in first.changes} == {"add"}
    assert "10.0.0.2 : jump in-" not in nft.scripts[0]
    assert any(
        (k, (v or "")[:8]) == ("10.0.0.2", "jump in-")
        for c in first.changes
        for k, v in c.elements
    )
    add_endpoint(netpol, "b", "10.0.0.2", app="web")  # b joins a's peers: one element
    assert netpol.sync() and len(nft.scripts) == 1
    [_, batch] = nft.batches
    assert [(c.verb, c.set[:6], c.elements) for c in batch.changes] == [
        ("add", "pods4-", (("10.0.0.2", None),))
    ]


def test_a_refused_diff_is_rendered_whole_in_the_same_pass(
    sync: tuple[NetpolSync, RecordingNft],
) -> None:
    netpol, nft = sync
    add_endpoint(netpol, "a", "10.0.0.1")
    netpol.sync()
    add_endpoint(netpol, "b", "10.0.0.2")
    nft.refuse = 1
    assert netpol.sync()
    [_first, diff, _whole] = nft.batches  # b's entries and counter, refused; the whole
    assert [c.name for c in diff.counters] == ["dropped-in/x/b"]
    [full] = nft.scripts[1:]
    assert "flush table" in full
    assert netpol.metrics.failures.value() == 1 and netpol.layout is not None
    assert set(netpol.layout.counters) == {"dropped-in/x/a", "dropped-in/x/b"}


def test_the_committed_layout_is_dropped_when_the_kernel_refuses(
    sync: tuple[NetpolSync, RecordingNft],
) -> None:
    netpol, nft = sync
    add_endpoint(netpol, "a", "10.0.0.1")
    netpol.sync()
    add_endpoint(netpol, "b", "10.0.0.2")
    nft.refuse = 2  # the diff, then the full render
    with pytest.raises(NftError, match="refused"):
        netpol.sync()
    assert netpol.layout is None and netpol.objects is None
    assert netpol.metrics.failures.value() == 2
    assert netpol.sync() and "flush table" in nft.scripts[-1]  # whole again, then diffs
    scripts, batches = len(nft.scripts), len(nft.batches)
    add_endpoint(netpol, "c", "10.0.0.3")
    assert netpol.sync() and (len(nft.scripts), len(nft.batches)) == (scripts, batches + 1)


def test_the_drop_counters_are_read_on_a_loop_of_their_own_never_by_a_pass(
    sync: tuple[NetpolSync, RecordingNft],
) -> None:
    """A listing (~200 ms at 1,000 policies) on the pass's thread held up the next pass."""
    netpol, nft = sync
    add_endpoint(netpol, "a", "10.0.0.1")
    netpol.counters_due = time.monotonic() + COUNTERS  # as after a read
    netpol.step()
    assert netpol.ok_through == 1 and nft.listings == []
    assert netpol.counters_wake.is_set()  # the pass changed the table: read them soon
    assert 0 < netpol.step_counters() <= COUNTERS_AFTER  # not due yet
    netpol.counters_due = 0.0
    assert netpol.step_counters() <= LOCAL_ADDRESSES  # the loop also reads the addresses
    assert COUNTERS_AFTER < netpol.counters_due - time.monotonic() <= COUNTERS  # next read
    assert nft.listings == ["counters of inet pycni-netpol"]
    assert 'pycni_netpol_dropped_packets{direction="ingress"} 7' in netpol.metrics.dropped.render()
    assert 'pycni_netpol_dropped_packets{direction="egress"} 2' in netpol.metrics.dropped.render()

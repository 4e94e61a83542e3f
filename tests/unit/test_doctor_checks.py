"""The doctor's policy, pure: what counts as unexplained on a node (``doctor/checks.py``,
``doctor/peers.py``), over hand-made ``NodeFacts``; and which networks it judges, from a CNI
config directory."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.attachment import Attachment
from doctor.findings import (
    CURRENT_TABLES,
    Lease,
    NftElement,
    NftObject,
    NftTable,
    NodeFacts,
    Peers,
    TableGraph,
    Veth,
)
from doctor.read import read_bridge_networks
from doctor.run import find_all
from ipam.records import HandleId, HandleRecord, LeasedIP
from kernel.ndproxy import Proxy
from kernel.neigh import Fdb, Neigh
from kernel.route import Route
from masq.rules import Element
from nodes.record import OverlayInfo
from store.base import KV

NODE, NET = "node1", "podnet"


def lease(cid: str, ip: str, node: str = NODE, network: str = NET) -> Lease:
    record = HandleRecord(
        HandleId(network, cid, "eth0"),
        (LeasedIP(f"{ip}/24", None, "pool", "10.22.0.0/26"),),
        {"node": node},
    )
    return Lease(KV(str(record.handle), b"", 1), record)


def veth(cid: str, network: str = NET) -> Veth:
    att = Attachment(network, cid, "eth0")
    return Veth(att.host_veth, att.tag)


def masq(ip: str, cid: str) -> Element:
    return Element("masq4", f'"pycni0" . {ip}', f"{NET}/{cid}/eth0")


def netpol(ip: str) -> NftElement:
    return NftElement("inet", "pycni-netpol", "self4", f"{ip} . {ip}", ip)


def kinds(facts: NodeFacts) -> list[tuple[str, str]]:
    return sorted((f.kind, f.object) for f in find_all(facts))


LIVE = NodeFacts(
    node=NODE,
    networks=frozenset({NET}),
    leases=(lease("c1", "10.22.0.2"),),
    veths=(veth("c1"),),
    masq=(masq("10.22.0.2", "c1"),),
    netpol=(netpol("10.22.0.2"),),
    tables=tuple(NftTable(f, n) for f, n in sorted(CURRENT_TABLES)),
)


def test_a_live_attachment_and_the_current_tables_are_explained():
    assert kinds(LIVE) == []


def test_a_veth_without_a_lease_and_a_lease_without_a_veth():
    facts = replace(
        LIVE, veths=(veth("c1"), veth("gone")), leases=(*LIVE.leases, lease("c2", "10.22.0.3"))
    )
    assert kinds(facts) == [("lease", f"{NET}/c2/eth0"), ("veth", veth("gone").name)]


def test_a_lease_younger_than_the_grace_is_not_judged():
    young = lease("c2", "10.22.0.3")
    young = replace(young, record=replace(young.record, created_at=100.0))
    facts = replace(LIVE, leases=(*LIVE.leases, young), masq=(masq("10.22.0.3", "c2"),))
    assert kinds(replace(facts, young_after=99.0)) == []  # an ADD may be making its veth
    assert [k for k, _ in kinds(replace(facts, young_after=100.0))] == ["lease", "masq-element"]


def test_elements_of_a_lease_that_repair_releases_are_unexplained_in_the_same_run():
    facts = replace(
        LIVE,
        leases=(*LIVE.leases, lease("c2", "10.22.0.3")),
        masq=(masq("10.22.0.3", "c2"),),
        netpol=(netpol("10.22.0.3"),),
    )
    assert [k for k, _ in kinds(facts)] == ["lease", "masq-element", "netpol-element"]


def test_another_networks_or_another_nodes_attachments_are_not_judged():
    facts = replace(
        LIVE,
        veths=(*LIVE.veths, veth("x", network="other")),
        leases=(
            *LIVE.leases,
            lease("y", "10.22.0.9", network="other"),
            lease("z", "10.22.0.8", node="node2"),
        ),
        masq=(*LIVE.masq, Element("masq4", '"br1" . 10.30.0.2', "other/x/eth0")),
    )
    assert kinds(facts) == []


def test_a_stale_table_is_one_the_code_does_not_make():
    facts = replace(
        LIVE, tables=(*LIVE.tables, NftTable("inet", "pycni-old"), NftTable("inet", "filter"))
    )
    assert kinds(facts) == [("table", "inet pycni-old")]
    assert ("ip6", "pycni-svc") in CURRENT_TABLES and ("inet", "pycni-masq") in CURRENT_TABLES


def test_service_backends_are_judged_only_against_endpoint_records_in_the_store():
    backend = NftElement("ip", "pycni-svc", "backends-tcp", "10.96.0.1 . 6 . 80 . 0", "10.22.0.7")
    facts = replace(LIVE, backends=(backend,), endpoint_ips=frozenset({"10.22.0.2"}))
    assert [k for k, _ in kinds(facts)] == ["svc-backend"]
    assert kinds(replace(facts, endpoint_ips=frozenset({"10.22.0.7"}))) == []
    assert kinds(replace(facts, endpoint_ips=None)) == []  # the API server's endpoints


def test_a_departed_nodes_overlay_entries():
    stays = OverlayInfo("vxlan", "192.0.2.2", "66:00:00:00:00:02", ("10.99.1.1",))
    peers = Peers(
        recorded=frozenset({"node2"}),
        overlays=(stays,),
        blocks=(("10.99.1.0/26", "node2"), ("10.99.0.0/26", "gone")),
        allocated=frozenset({"fd00:99:1::5", "10.22.0.2"}),
        routes=(
            Route(ipaddress.ip_network("10.99.1.0/26"), ipaddress.ip_address("10.99.1.1")),
            Route(ipaddress.ip_network("10.99.0.0/26"), ipaddress.ip_address("10.99.0.1")),
            Route(ipaddress.ip_network("10.22.0.2/32")),  # an allocated address: a host route
        ),
        neighs=(
            Neigh(5, ipaddress.ip_address("10.99.1.1"), "66:00:00:00:00:02", 77),
            Neigh(5, ipaddress.ip_address("10.99.0.1"), "66:00:00:00:00:01", 77),
        ),
        fdbs=(
            Fdb(5, "66:00:00:00:00:02", ipaddress.ip_address("192.0.2.2")),
            Fdb(5, "66:00:00:00:00:01", ipaddress.ip_address("192.0.2.1")),
        ),
        proxies=(
            Proxy(3, "fd00:99:1::5", 77),  # allocated in node2's block
            Proxy(3, "fd00:99::7", 77),
        ),
        accepted=(
            NftElement("inet", "pycni-overlay", "peers4", "192.0.2.2", "192.0.2.2"),
            NftElement("inet", "pycni-overlay", "peers4", "192.0.2.1", "192.0.2.1"),
        ),
    )
    assert kinds(replace(LIVE, peers=peers)) == [
        ("overlay-fdb", "66:00:00:00:00:01 dst 192.0.2.1"),
        ("overlay-neigh", "10.99.0.1 lladdr 66:00:00:00:00:01"),
        ("overlay-peer", "inet pycni-overlay peers4 { 192.0.2.1 }"),
        ("overlay-proxy", "proxy fd00:99::7 dev #3"),
        ("overlay-route", "10.99.0.0/26 via 10.99.0.1 proto 77"),
    ]


def test_the_networks_judged_are_those_where_pycni_bridge_leases_from_pycni_ipam(tmp_path):
    bridge = {"type": "pycni-bridge", "ipam": {"type": "pycni-ipam"}}
    files = {
        "10-a.conflist": {"name": "a", "plugins": [bridge, {"type": "portmap"}]},
        "20-b.conflist": {"name": "b", "plugins": [{**bridge, "ipam": {"type": "host-local"}}]},
        "30-c.conf": {"name": "c", **bridge},
        "40-d.conflist": {"name": "d", "plugins": ["junk", {"type": "pycni-bridge"}]},
    }
    for name, conf in files.items():
        (tmp_path / name).write_text(json.dumps(conf))
    (tmp_path / "50-e.conflist").write_text("{not json")
    assert read_bridge_networks(str(tmp_path)) == ["a", "c"]
    assert read_bridge_networks(str(tmp_path / "missing")) == []


def obj(kind: str, name: str) -> NftObject:
    return NftObject("ip", "pycni-svc", kind, name)


def test_objects_nothing_reaches_from_a_base_chain_and_not_static_are_unexplained():
    """A shape chain a restart left (no element of a reachable map names it) and the set only
    it used; a static map nothing references now (the backends maps without a shape) is not."""
    graph = TableGraph(
        objects=(
            obj("chain", "nat-prerouting"),
            obj("map", "service-ips"),
            obj("chain", "lb-2"),
            obj("chain", "lb-5"),
            obj("set", "clients-x"),
            obj("map", "backends-tcp"),
        ),
        base=frozenset({"chain:nat-prerouting"}),
        refs={
            "chain:nat-prerouting": frozenset({"set:service-ips"}),
            "set:service-ips": frozenset({"chain:lb-2"}),
            "chain:lb-5": frozenset({"set:clients-x"}),
        },
    )
    assert kinds(replace(LIVE, graphs=(graph,))) == [
        ("nft-object", "chain ip pycni-svc lb-5"),
        ("nft-object", "set ip pycni-svc clients-x"),
    ]


def test_only_what_a_second_look_still_finds_is_reported(monkeypatch):
    """A DEL's NetworkPolicy elements, gone by the second look, are not residue; what stays
    is reported as the second look found it; nothing found at first is one look only."""
    from typing import Any

    from doctor import run
    from doctor.findings import Finding

    def reads(*looks: list[Finding]) -> Any:
        found = iter(looks)
        return lambda: next(found)  # find_all is the identity below: a look is its findings

    monkeypatch.setattr(run, "find_all", lambda facts: facts)
    slept: list[float] = []
    monkeypatch.setattr(run.time, "sleep", slept.append)
    first = [Finding("netpol-element", "a", "first"), Finding("veth", "b", "first")]
    second = [Finding("veth", "b", "second"), Finding("table", "c", "second")]
    assert run.find_lasting(reads(first, second), 1.0) == [Finding("veth", "b", "second")]
    assert slept == [1.0]
    assert run.find_lasting(reads([]), 1.0) == [] and slept == [1.0]
    assert run.find_lasting(reads(first), 0.0) == first


@given(
    st.lists(st.tuples(st.sampled_from(["veth", "lease", "table"]), st.sampled_from("abcd"))),
    st.lists(st.tuples(st.sampled_from(["veth", "lease", "table"]), st.sampled_from("abcd"))),
)
def test_a_second_look_reports_exactly_its_findings_the_first_look_had_too(first, second):
    """Generated looks: the report is the second look's findings (in its order, as it saw
    them) whose kind and object the first look found; an empty first look is the only one."""
    from typing import Any

    from doctor import run
    from doctor.findings import Finding

    one = [Finding(k, o, "first") for k, o in first]
    two = [Finding(k, o, "second") for k, o in second]
    looks = iter([one, two])
    read: Any = lambda: next(looks)  # noqa: E731 (find_all is the identity below)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run, "find_all", lambda facts: facts)
        patch.setattr(run.time, "sleep", lambda seconds: None)
        found = run.find_lasting(read, 1.0)
    seen = {(k, o) for k, o in first}
    assert found == ([] if not first else [f for f in two if (f.kind, f.object) in seen])
    assert all(f.why == "second" for f in found)

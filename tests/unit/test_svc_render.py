"""The Service proxy's layout (golden files), element diffs and tracer invariants (hypothesis).

Regenerate the golden files after an intended change with PYCNI_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import ipaddress
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni.spec.errors import InvalidConfig
from services.proxy.elements import calc_elements, calc_entries, calc_service_parts
from services.proxy.model import (
    PROTOCOLS,
    NodeView,
    ProxyModel,
    ProxyPort,
    ProxyService,
    ServicePortView,
)
from services.proxy.render import BACKENDS_MAPS, AffinityChain, backends_map
from services.proxy.table import render_transaction
from services.proxy.trace import explain
from tests.fixtures.golden import GOLDEN, golden  # noqa: F401
from tests.fixtures.svc_model import MODEL, MODEL6, NODE, be


@pytest.mark.parametrize("name,model", [("svc_full4.nft", MODEL), ("svc_full6.nft", MODEL6)])
def test_full_render_matches_golden(name, model):
    text = render_transaction(None, model)
    assert text == golden(name, text)


def test_update_is_element_churn_only():
    web = MODEL.ports[0]
    m1 = replace(MODEL, ports=(replace(web, backends=web.backends[:2]), *MODEL.ports[1:]))
    text = render_transaction(MODEL, m1)
    assert text == golden("svc_update4.nft", text)
    assert "add chain ip pycni-svc lb-2\n" in text and "flush map" not in text


def test_loopback_node_ip_and_bad_protocol_are_refused():
    with pytest.raises(InvalidConfig):
        NodeView("n", (ipaddress.ip_address("127.0.0.1"),))
    with pytest.raises(InvalidConfig) as bad:
        ProxyPort("p", "icmp", 80)
    assert bad.value.code == 7 and "protocol" in bad.value.msg


ADDRS = st.integers(2, 250).map(lambda i: ipaddress.ip_address(f"10.0.0.{i}"))
BACKENDS = st.lists(
    st.builds(lambda ip, local: be(str(ip), 8080, local), ADDRS, st.booleans()),
    max_size=5,
    unique_by=lambda b: b.ip,
)


@st.composite
def models(draw) -> ProxyModel:
    views = []
    for i in range(draw(st.integers(0, 5))):
        port = ProxyPort(
            "p",
            draw(st.sampled_from(["tcp", "udp", "sctp"])),
            80,
            draw(st.one_of(st.none(), st.just(30000 + i))),
        )
        svc = ProxyService(
            "ns",
            f"s{i}",
            (ipaddress.ip_address(f"10.96.0.{i + 1}"),),
            draw(st.sampled_from([(), (ipaddress.ip_address(f"192.168.99.{i + 1}"),)])),
            (port,),
            draw(st.sampled_from([None, 10, 10800])),
            draw(st.booleans()),
            draw(st.booleans()),
        )
        views.append(ServicePortView(svc, port, tuple(draw(BACKENDS))))
    return ProxyModel(4, NODE, tuple(views))


NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-")


def calc_reached(
    model: ProxyModel, view: ServicePortView, entry: str, key: str, short: bool = False
) -> set[str]:
    """The ``ip . port`` an entry's dispatch (``short``: its short-circuit for clients in
    the cluster) leads to: its bucket in the backends map, or the endpoints its affinity
    chain names."""
    elements, shapes = calc_service_parts(model)
    prefix = "sc-service-" if short else "service-"
    dispatch = {e.value for e in elements if e.key == key and e.name.startswith(prefix)}
    chains = {s.chain: s for s in shapes if isinstance(s, AffinityChain)}
    if not dispatch:
        return set()
    (goto,) = dispatch
    if (chain := chains.get(goto.removeprefix("goto "))) is not None:
        return {f"{ip} . {port}" for ip, port, _ in chain.backends}
    name = backends_map(f"sc-{entry}" if short else entry, view.port.protocol)
    return {e.value for e in elements if e.name == name and e.key.rsplit(" . ", 1)[0] == key}


@settings(max_examples=60, deadline=None)
@given(models())
def test_elements_are_well_formed_and_buckets_hold_exactly_the_backends(model):
    elements = calc_elements(model)
    assert all(set(e.name) <= NAME_CHARS for e in elements)
    for view in model.ports:
        for entry, key, external in calc_entries(view, model):
            reached = calc_reached(model, view, entry, key)
            assert reached == {f"{b.ip} . {b.port}" for b in view.calc_backends(external)}
            short = calc_reached(model, view, entry, key, short=True)
            every = {f"{b.ip} . {b.port}" for b in view.calc_backends(external, in_cluster=True)}
            assert short == (every if external and view.service.external_local else set())


@settings(max_examples=60, deadline=None)
@given(models())
def test_affinity_is_keyed_per_service_port_not_per_entry(model):
    """Every entry of an affinity port (ClusterIP, externalIP, NodePort, Local twin or not)
    reaches an endpoint under the same key in ``clients``; two ports never share one; a
    port without affinity has no chain of its own."""
    _, shapes = calc_service_parts(model)
    chains = [s for s in shapes if isinstance(s, AffinityChain)]
    owner: dict[int, tuple] = {}
    for chain in chains:
        assert chain.chain.startswith("sticky-") and len(chain.chain) < 256
        for ip, port, key in chain.backends:
            mine = (chain.chain.split("-", 2)[2].removesuffix("/local"), ip, port)
            assert owner.setdefault(key, mine) == mine
    for view in model.ports:
        if view.service.affinity_timeout is None:
            assert not any(view.service.name in c.chain for c in chains)


@settings(max_examples=60, deadline=None)
@given(models())
def test_each_protocols_backends_live_in_that_protocols_map_only(model):
    """The lb chains read ``backends-P`` only for protocol P: an element elsewhere is dead."""
    elements = calc_elements(model)
    for view in model.ports:
        proto = view.port.protocol
        for entry, key, external in calc_entries(view, model):
            mine = {
                e.name
                for e in elements
                if e.name in BACKENDS_MAPS and e.key.rsplit(" . ", 1)[0] == key
            }
            shared = view.service.affinity_timeout is None
            want = (
                {backends_map(entry, proto)} if view.calc_backends(external) and shared else set()
            )
            if view.is_short_circuit(external) and shared:
                want.add(backends_map(f"sc-{entry}", proto))
            assert mine == want
    assert all(
        f" {e.name.rsplit('-', 1)[1]} . " in f" {e.key} "
        for e in elements
        if e.name in BACKENDS_MAPS
    )


def test_every_shape_chain_has_one_guarded_dnat_rule_per_protocol():
    text = render_transaction(None, MODEL)
    for chain in ("lb-3", "np-lb-3", "lb-1", "sticky-5MMVLXQGDJ-default/sticky/tcp/80"):
        rules = [
            r
            for r in text.splitlines()
            if r.startswith(f"add rule ip pycni-svc {chain} ") and " dnat " in f" {r} "
        ]
        if chain.startswith(("lb", "np-lb")):
            assert [r.split(f"{chain} meta l4proto ")[1].split()[0] for r in rules] == list(
                PROTOCOLS
            )
            assert all(
                f"map @{'np-' * chain.startswith('np')}backends-{p}" in r
                for p, r in zip(PROTOCOLS, rules, strict=True)
            )
        else:  # an affinity port's chain: its own protocol, its endpoints by address, then
            # one pick through its endpoints in sticky-backends-tcp (the clients set full)
            *named, unstuck = rules
            assert named and all(" meta l4proto tcp dnat ip to 10.0." in r for r in named)
            assert unstuck.endswith(" numgen random mod 2 map @sticky-backends-tcp")
            key = unstuck.split(" dnat ip to ")[1].rsplit(" . numgen random mod 2 ", 1)[0]
            high, low = (
                int(w) for w in key.replace("numgen random mod 1 offset ", "").split(" . ")
            )
            shown = f"{high} . {low}"
            endpoints = f"{shown} . 0 : 10.0.0.2 . 8080, {shown} . 1 : 10.0.1.2 . 8080"
            assert f"add element ip pycni-svc sticky-backends-tcp {{ {endpoints} }}" in text


@settings(max_examples=60, deadline=None)
@given(models(), st.sampled_from(["10.0.0.2", "203.0.113.5", "192.168.0.2", "127.0.0.1"]))
def test_tracer_probabilities_sum_to_one_over_that_ports_backends(model, src):
    """A Pod (10.0.0.0/16) or the node (its NodePort address, loopback) reaching an external
    entry of a Local-policy Service is short-circuited to every backend, the node's own
    traffic masqueraded; only an outside client meets the policy."""
    outside = src == "203.0.113.5"
    for view in model.ports:
        for entry, key, external in calc_entries(view, model):
            dst = NODE.node_ips[0] if entry == "np" else ipaddress.ip_address(key.split(" . ")[0])
            port = view.port.node_port if entry == "np" else view.port.port
            a = explain(model, NODE, ipaddress.ip_address(src), 999, dst, port, view.port.protocol)
            allowed = view.calc_backends(external, in_cluster=not outside)
            assert {(c.ip, c.port) for c in a.choices} == {(str(b.ip), b.port) for b in allowed}
            if a.choices:
                assert abs(sum(c.probability for c in a.choices) - 1) < 1e-9
            else:
                assert a.verdict in ("reject", "drop")
            if view.is_local_policy(external) and (outside or not external):
                assert all(c.node == "n1" for c in a.choices)
            if external and view.service.external_local and not outside and view.backends:
                assert {(c.ip, c.port) for c in a.choices} == {
                    (str(b.ip), b.port) for b in view.backends
                }
                node = src in ("192.168.0.2", "127.0.0.1")
                assert all(c.masquerade == (node or c.ip == src) for c in a.choices), a

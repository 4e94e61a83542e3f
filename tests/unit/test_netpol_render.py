"""netpol/render.py: the node's pycni-netpol table from PolicyInputs (pure). The verdicts
it encodes are checked against netpol.evaluate with real packets in
tests/netns/test_netpol_enforce.py; here the layout: what is local, what is shared, how a
rule becomes set lookups."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from netpol.evaluate import NamedPort, PodInfo, PolicyInputs
from netpol.members import Members, to_int
from netpol.policy import NetworkPolicy, parse_policy
from netpol.render import (
    REFERENCE,
    SPLICE_MAX,
    Layout,
    LayoutCache,
    Term,
    _is_static,
    calc_block_members,
    calc_layout,
    calc_pod_elements,
    made_of,
    render_full,
    shape_name,
    splice,
)
from tests.fixtures.netpol_cases import clusters, inputs_of

NODE = "n1"


def pod(ns: str, name: str, ip: str, node: str = NODE, **labels: str) -> PodInfo:
    ports = (NamedPort("web", "TCP", 8080), NamedPort("dns", "UDP", 53))
    return PodInfo(ns, name, (ip,), {"pod": name, **labels}, node, ports)


def policy(ns: str, name: str, **spec: object) -> NetworkPolicy:
    return parse_policy(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"namespace": ns, "name": name},
            "spec": {"podSelector": {}, **spec},
        }
    )


PODS = (
    pod("x", "a", "10.0.0.2"),
    pod("x", "b", "10.0.0.3"),
    pod("y", "a", "fd00::2"),
    pod("x", "r", "10.0.1.2", node="n2"),
)


def inputs(*policies: NetworkPolicy) -> PolicyInputs:
    return PolicyInputs(PODS, {"x": {"team": "x"}}, tuple(policies))


def test_only_local_pods_are_isolated_and_equal_policy_lists_share_a_chain() -> None:
    layout = calc_layout(inputs(policy("x", "deny")), NODE)
    assert layout.isolated == {"Ingress": 2, "Egress": 0}
    [chain] = layout.chains
    assert set(layout.sets["ingress4"].elements) == {
        f"10.0.0.2 : jump {chain}",
        f"10.0.0.3 : jump {chain}",
    }
    assert layout.chains[chain][-1] == "counter drop"  # no rule: everything dropped
    assert layout.sets["ingress6"].elements == () and layout.sets["egress4"].elements == ()
    assert layout.counters == {"dropped-in/x/a", "dropped-in/x/b"}


def test_allow_all_rule_is_a_bare_return_and_a_change_is_a_new_chain() -> None:
    allow = policy("x", "all", ingress=[{}])
    layout = calc_layout(inputs(allow), NODE)
    [chain] = layout.chains
    assert layout.chains[chain][0] == "return"
    other = policy("x", "all", ingress=[{"ports": [{"port": 80}]}])
    assert shape_name("in", [other]) != chain


def test_peers_are_pods_their_selectors_pick_remote_ones_included_and_ipblocks() -> None:
    p = policy(
        "x",
        "p",
        ingress=[
            {
                "from": [
                    {"podSelector": {"matchLabels": {"pod": "r"}}},
                    {"ipBlock": {"cidr": "192.168.0.0/16", "except": ["192.168.1.0/24"]}},
                ]
            }
        ],
    )
    assert calc_pod_elements(Members(inputs(p)), p, p.ingress[0], 4) == ["10.0.1.2"]
    members = calc_block_members(p.ingress[0], 4)

    def held(address: str) -> bool:
        return any(low <= to_int(address) <= high for low, high in members)

    assert all(held(a) for a in ("192.168.0.0", "192.168.0.9", "192.168.255.255"))
    assert not any(held(a) for a in ("192.168.1.0", "192.168.1.7", "10.0.1.2", "192.169.0.0"))
    assert members == sorted(members)  # disjoint, merged: what an interval set takes
    [chain] = calc_layout(inputs(p), NODE).chains.values()
    pods, blocks = (r.split("@")[1].split()[0] for r in chain[:2])
    assert pods.startswith("pods4-") and blocks.startswith("blocks4-")  # one rule each


def test_named_ports_resolve_with_their_protocol_numeric_ones_as_intervals() -> None:
    p = policy(
        "x",
        "p",
        ingress=[
            {
                "ports": [
                    {"port": "web"},
                    {"port": "dns", "protocol": "TCP"},  # dns is UDP: matches nothing
                    {"port": 80, "endPort": 90, "protocol": "UDP"},
                    {"port": 85, "protocol": "UDP"},  # inside the range: one interval
                    {"port": 91, "protocol": "UDP"},  # next to it: merged
                    {"protocol": "SCTP"},
                ]
            }
        ],
    )
    layout = calc_layout(inputs(p), NODE)
    [chain] = layout.chains
    named = next(s.elements for n, s in layout.sets.items() if n.startswith("named4-"))
    assert "10.0.0.2 . tcp . 8080" in named and not any(" 53" in e for e in named)
    ports = next(s.elements for n, s in layout.sets.items() if n.startswith("ports-"))
    assert set(ports) == {"udp . 80-91", "sctp . 0-65535"}


def test_full_render_flushes_and_refills_without_deleting_the_table() -> None:
    layout = calc_layout(inputs(policy("x", "deny")), NODE)
    script = render_full(layout, [("chain", "in-gone"), ("set", "pods4-gone")])
    lines = script.splitlines()
    assert lines[:2] == ["add table inet pycni-netpol", "flush table inet pycni-netpol"]
    assert "delete table" not in script
    deletes = [i for i, line in enumerate(lines) if line.startswith("delete ")]
    flushes = [i for i, line in enumerate(lines) if line.startswith("flush map")]
    assert lines[deletes[0]] == "delete set inet pycni-netpol pods4-gone"  # before its chain
    assert max(flushes) < min(deletes)
    assert render_full(layout) == render_full(layout)


def test_a_counter_name_nft_would_refuse_is_hashed() -> None:
    long = pod("x", "a" * 253, "10.0.0.9")
    layout = calc_layout(PolicyInputs((long,), {}, (policy("x", "deny"),)), NODE)
    [counter] = layout.counters
    assert counter.startswith("dropped-in/") and len(counter) < 64


def test_a_namespace_one_peer_stops_picking_while_another_still_does_changes_the_set() -> None:
    """Two peers of one rule: Pods ``pod: a`` in every namespace, and every Pod of the
    namespaces labelled ``team: z``. Namespace z loses its label: both peers together still
    read x, y and z, but z's other Pods leave the set (a cached render once kept them, its
    deps being the union of the namespaces read)."""
    pods = tuple(
        pod(ns, name, f"10.0.{i}.{j}") for i, ns in enumerate("xyz") for j, name in enumerate("ab")
    )
    rule = {
        "from": [
            {"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "a"}}},
            {"namespaceSelector": {"matchLabels": {"team": "z"}}},
        ]
    }
    policies = (policy("x", "p", policyTypes=["Ingress"], ingress=[rule]),)
    cache = LayoutCache()
    before = PolicyInputs(pods, {"z": {"team": "z"}}, policies)
    assert peer_elements(calc_layout(before, NODE, cache=cache)) == {
        ("10.0.0.0", "10.0.1.0", "10.0.2.0", "10.0.2.1")
    }
    after = PolicyInputs(pods, {"z": {}}, policies)
    kept = calc_layout(after, NODE, cache=cache)
    assert peer_elements(kept) == {("10.0.0.0", "10.0.1.0", "10.0.2.0")}
    assert kept == calc_layout(after, NODE)


def peer_elements(layout: Layout) -> set[tuple[str, ...]]:
    return {s.elements for name, s in layout.sets.items() if name.startswith("pods4-")}


def test_a_rule_whose_peers_pick_nothing_declares_no_set() -> None:
    """Its ports' set was made before its peers turned out empty: a set no rule names, which
    the kernel would keep and ``pycni doctor`` report as left behind."""
    p = policy(
        "x",
        "p",
        egress=[
            {
                "to": [{"namespaceSelector": {"matchLabels": {"ns": "none"}}}],
                "ports": [{"port": 81}, {"port": "web"}],
            },
            {"to": [{"podSelector": {"matchLabels": {"pod": "r"}}}], "ports": [{"port": "none"}]},
        ],
    )
    layout = calc_layout(inputs(p), NODE)
    assert [n for n in layout.sets if not _is_static(n)] == []
    egress = next(rules for c, rules in layout.chains.items() if c.startswith("eg-"))
    assert egress[-1] == "counter drop" and not any(r.endswith("return") for r in egress)


@settings(max_examples=150, deadline=None)
@given(clusters())
def test_every_set_a_layout_declares_is_static_or_named_by_a_rule(cluster) -> None:
    layout = calc_layout(inputs_of(cluster), NODE)
    named = {m for rules in layout.chains.values() for r in rules for m in REFERENCE.findall(r)}
    assert {n for n in layout.sets if not _is_static(n)} == {n for n in named if not _is_static(n)}
    assert named <= set(layout.sets)  # and every set a rule names is declared


PART = st.lists(st.sampled_from([f"10.0.0.{i}" for i in range(8)]), max_size=4).map(tuple)


@settings(max_examples=500)
@given(st.lists(PART, max_size=12), st.data())
def test_a_spliced_peer_set_is_the_set_computed_whole(old: list[tuple[str, ...]], data) -> None:
    """Parts kept (the same objects) or redrawn, from a few addresses so that parts overlap
    and repeat: splicing gives the elements computed whole, or declines; it declines only
    when the parts before or after hold an address twice, or too many changed."""
    new = tuple(part if data.draw(st.booleans()) else data.draw(PART) for part in old)
    term = Term("pods4-x", "ipv4_addr", False, lambda _members: ())
    whole_old = tuple(dict.fromkeys(a for part in old for a in part))
    exact_old = len(whole_old) == sum(map(len, old))
    before = made_of(term, None, whole_old, tuple(old) if exact_old else None)
    got = splice(before, new)
    whole = tuple(dict.fromkeys(a for part in new for a in part))
    assert got is None or got == whole
    changed = sum(1 for a, b in zip(old, new, strict=True) if a is not b)
    if exact_old and len(whole) == sum(map(len, new)) and changed <= SPLICE_MAX:
        assert got == whole

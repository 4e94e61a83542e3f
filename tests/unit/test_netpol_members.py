"""netpol/members.py's index answers what netpol.evaluate answers: for generated namespaces,
Pods and peers, the addresses a peer picks are exactly the Pods ``peer_matches`` accepts, and
a named port resolves where ``PodInfo.resolve`` does. A ``Grouping`` kept over generated
passes (Pods kept as the same objects, replaced, added, removed; namespace labels changed)
answers exactly what one made for each pass's inputs answers."""

from __future__ import annotations

import ipaddress
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from netpol import evaluate
from netpol.evaluate import NamedPort, PodInfo, PolicyInputs, _ip, peer_matches
from netpol.members import Flat, Grouping, Members, addresses, group_by_namespace
from netpol.policy import NetworkPolicy, Peer, PolicyPort, Rule
from netpol.selector import LabelSelector, Requirement

KEYS, VALUES, NAMESPACES = ("app", "tier"), ("a", "b"), ("x", "y", "z")
labels = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2)
requirement = st.builds(
    lambda key, op, values: Requirement(key, op, values if op in ("In", "NotIn") else ()),
    st.sampled_from((*KEYS, "kubernetes.io/metadata.name")),
    st.sampled_from(("In", "NotIn", "Exists", "DoesNotExist")),
    st.lists(st.sampled_from((*VALUES, *NAMESPACES)), min_size=1, max_size=2).map(
        lambda v: tuple(sorted(set(v)))
    ),
)
selector = st.builds(
    lambda pairs, reqs: LabelSelector(tuple(sorted(pairs.items())), tuple(reqs)),
    labels,
    st.lists(requirement, max_size=2),
)
peer = st.builds(Peer, st.none() | selector, st.none() | selector).filter(
    lambda p: p.pod_selector is not None or p.namespace_selector is not None
)


@st.composite
def cluster(draw: st.DrawFn) -> PolicyInputs:
    pods = []
    for index in range(draw(st.integers(0, 8))):
        ports = draw(
            st.lists(
                st.builds(
                    NamedPort,
                    st.sampled_from(("http", "dns")),
                    st.sampled_from(("TCP", "UDP")),
                    st.sampled_from((53, 80)),
                ),
                max_size=2,
            )
        )
        ips = (f"10.0.0.{index + 1}", f"fd00::{index + 1}")
        ns = draw(st.sampled_from(NAMESPACES))
        pods.append(PodInfo(ns, f"p{index}", ips, draw(labels), "n1", tuple(ports)))
    namespaces = {ns: draw(labels) for ns in NAMESPACES}
    return PolicyInputs(tuple(pods), namespaces)


@settings(max_examples=200, deadline=None)
@given(cluster(), peer, st.sampled_from(NAMESPACES), st.sampled_from((4, 6)))
def test_peer_addresses_are_the_pods_peer_matches_accepts(
    inputs: PolicyInputs, picked: Peer, namespace: str, family: int
) -> None:
    policy = NetworkPolicy(namespace, "p")
    expected = {
        ip
        for pod in inputs.pods
        for ip in pod.ips
        if _ip(ip).version == family and peer_matches(inputs, policy, picked, pod, _ip(ip))
    }
    assert set(Members(inputs).peer_addresses(policy, picked, family)) == expected


def naming(inputs: PolicyInputs, *names: str) -> PolicyInputs:
    """``inputs`` with a policy whose ingress rule names the ports ``names``."""
    ports = tuple(PolicyPort(port=name) for name in names)
    policy = NetworkPolicy("x", "named", ingress=(Rule(ports=ports),))
    return replace(inputs, policies=(*inputs.policies, policy))


def test_a_name_given_twice_resolves_to_the_first() -> None:
    ports = (NamedPort("http", "TCP", 53), NamedPort("http", "TCP", 80))
    inputs = naming(PolicyInputs((PodInfo("x", "a", ("10.0.0.1",), {}, "n1", ports),)), "http")
    assert Members(inputs).named_port("http", "TCP", 4) == ("10.0.0.1 . tcp . 53",)


def test_only_the_names_a_policy_uses_are_elements_and_a_new_one_moves_the_stamp() -> None:
    ports = (NamedPort("http", "TCP", 80), NamedPort("dns", "UDP", 53))
    pods = (PodInfo("x", "a", ("10.0.0.1",), {}, "n1", ports),)
    grouping = Grouping()
    http = Members(naming(PolicyInputs(pods), "http"), grouping)
    assert grouping.named_in("x") == {("http", "TCP", 4): ("10.0.0.1 . tcp . 80",)}
    assert http.named_port("dns", "UDP", 4) == ()
    stamp = grouping.named_stamp
    both = Members(naming(PolicyInputs(pods), "http", "dns"), grouping)
    assert grouping.named_stamp > stamp  # the sets read under the old stamp are computed again
    assert both.named_port("dns", "UDP", 4) == ("10.0.0.1 . udp . 53",)


@settings(max_examples=100, deadline=None)
@given(cluster(), st.sampled_from(("http", "dns")), st.sampled_from(("TCP", "UDP")))
def test_named_ports_resolve_where_the_pod_does(
    inputs: PolicyInputs, name: str, protocol: str
) -> None:
    expected = {
        f"{ip} . {protocol.lower()} . {port}"
        for pod in inputs.pods
        if (port := pod.resolve(name, protocol)) is not None
        for ip in pod.ips
        if "." in ip
    }
    assert set(Members(naming(inputs, name)).named_port(name, protocol, 4)) == expected


def test_a_pods_addresses_are_parsed_once_per_pod_and_canonical(monkeypatch) -> None:
    parsed: list[str] = []
    real = ipaddress.ip_address
    monkeypatch.setattr(
        evaluate.ipaddress, "ip_address", lambda text: parsed.append(text) or real(text)
    )
    ips = ("10.9.0.7/24", "fd09:0::0:7")
    first = PodInfo("x", "a", ips, {}, "n1")
    for _ in range(3):
        assert addresses(first, 4) == ("10.9.0.7",) and addresses(first, 6) == ("fd09::7",)
    assert parsed == ["10.9.0.7", "fd09:0::0:7"]  # once, however often asked
    canonical = PodInfo("x", "b", ("10.9.0.8", "10.9.0.9"), {}, "n1")
    assert addresses(canonical, 4) is canonical.ips and addresses(canonical, 6) == ()
    v6 = PodInfo("x", "c", ("fd09::8",), {}, "n1")
    assert addresses(v6, 6) is v6.ips and addresses(v6, 4) == ()


@st.composite
def passes(draw: st.DrawFn) -> list[PolicyInputs]:
    """Successive inputs as ``view.PodCache`` hands them over: a Pod that did not change is
    the same object; the whole tuple is the same object when no Pod changed."""
    found: list[PolicyInputs] = []
    for _ in range(draw(st.integers(1, 4))):
        drawn = draw(cluster())
        if found and draw(st.booleans()):  # no Pod changed: the same tuple
            found.append(PolicyInputs(found[-1].pods, drawn.namespaces))
            continue
        before = found[-1].pods if found else ()
        kept = [
            before[i] if i < len(before) and draw(st.booleans()) else pod
            for i, pod in enumerate(drawn.pods)
        ]
        found.append(PolicyInputs(tuple(kept), drawn.namespaces))
    return found


@settings(max_examples=150, deadline=None)
@given(passes(), st.lists(peer, min_size=1, max_size=3), st.sampled_from(NAMESPACES))
def test_a_grouping_kept_between_passes_answers_as_a_fresh_one(
    inputs_seq: list[PolicyInputs], peers: list[Peer], namespace: str
) -> None:
    grouping = Grouping()
    policy = NetworkPolicy(namespace, "p")
    for inputs in inputs_seq:
        kept, fresh = Members(inputs, grouping), Members(inputs)
        for picked in peers:
            for family in (4, 6):
                assert kept.peer_addresses(policy, picked, family) == fresh.peer_addresses(
                    policy, picked, family
                )
        for name in ("http", "dns"):
            for protocol in ("TCP", "UDP"):
                for family in (4, 6):
                    assert kept.named_port(name, protocol, family) == fresh.named_port(
                        name, protocol, family
                    )


NAMES = st.text(alphabet="ab-.0", min_size=1, max_size=3)


@settings(max_examples=300)
@given(st.lists(st.tuples(NAMES, NAMES), unique=True, max_size=12))
def test_flat_groups_are_the_items_in_ref_order(refs: list[tuple[str, str]]) -> None:
    """``Flat`` over the groups of items sorted by ref gives them in ref order, whatever
    namespaces prefix or follow others ('a', 'a-b', 'a.', 'a0': '-' and '.' sort before '/',
    '0' after), and compares equal to that tuple both ways."""
    items = tuple(sorted((PodInfo(ns, name, ()) for ns, name in refs), key=lambda p: p.ref))
    flat = Flat(group_by_namespace(items))
    assert len(flat) == len(items)
    assert flat == items and items == flat
    assert list(flat) == list(items) and flat[:] == items
    assert flat != items + (PodInfo("z", "z", ()),)

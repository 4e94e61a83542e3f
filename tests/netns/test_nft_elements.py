"""``Nft.run_elements`` (kernel/nftelem.py) writes what nft writes: in a real netns, the proxy's
table gets the same element changes once through the script libnftables runs (``add|delete
element`` commands, services/proxy/elements.py ``render_elements``) and once as a netlink
batch, and the two listings must be equal, for generated elements of every set and map the
batch writes (both families: concatenations, verdicts, numgen's host-order index). A batch
the kernel refuses applies nothing, as a refused script."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.proxy.render import PREFIX, calc_element_types
from tests.fixtures.netns import in_netns_examples, program_in_netns

pytestmark = pytest.mark.netns
CHAINS = ("lb-1", "np-lb-2", "sc-lb-3", "reject-chain")
IN_NETNS = """
import json, sys
from kernel.nft import Nft, NftError
from services.proxy.elements import calc_element_batch, render_elements
from services.proxy.render import FAMILY, PREFIX, TABLE, Element, Shape
from services.proxy.render import render_shape, render_skeleton

nft = Nft()


def load(family, first):
    t = f"{FAMILY[family]} {TABLE}"
    nft.run(f"table {t}\\ndelete table {t}\\n")
    shapes = "".join(render_shape(family, Shape(e, "lb", n)) for e in PREFIX for n in (1, 2, 3))
    nft.run(render_skeleton(family) + shapes + render_elements(family, "add", first))


def listing(family):
    doc = nft.list_json(f"list table {FAMILY[family]} {TABLE}")
    return [o for o in doc["nftables"] if "map" in o or "set" in o]


out = []
for family, first, deletes, adds in json.loads(sys.stdin.read()):
    first, deletes, adds = ([Element(*e) for e in els] for els in (first, deletes, adds))
    answer = {}
    for path in ("script", "batch"):
        try:
            load(family, first)
        except NftError as exc:  # a first state the kernel refuses: nothing to compare
            answer = {"unloaded": str(exc)}
            break
        try:
            if path == "script":
                script = render_elements(family, "delete", deletes)
                nft.run(script + render_elements(family, "add", adds))
            else:
                batch = calc_element_batch(family, deletes, adds)
                assert batch is not None
                nft.run_elements(batch)
            error = None
        except NftError as exc:
            error = str(exc)
        answer[path] = {"error": error, "listing": listing(family)}
    out.append(answer)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def run_cases():
    yield from program_in_netns("elem", IN_NETNS)


def field(datatype: str) -> st.SearchStrategy[str]:
    if datatype in ("ipv4_addr", "ipv6_addr"):
        v = 4 if datatype == "ipv4_addr" else 6
        return st.ip_addresses(v=v).map(lambda ip: str(ipaddress.ip_address(ip)))
    if datatype == "inet_proto":
        return st.sampled_from(("tcp", "udp", "sctp"))
    if datatype == "inet_service":
        return st.integers(0, 65535).map(str)
    assert datatype == "host_u32"
    return st.integers(0, 2**32 - 1).map(str)


def value(types: tuple[str, ...]) -> st.SearchStrategy[str]:
    if types == ("verdict",):
        return st.sampled_from(("drop", *(f"goto {c}" for c in CHAINS)))
    return st.tuples(*map(field, types)).map(" . ".join)


def data(name: str, types: tuple[str, ...]) -> st.SearchStrategy[str]:
    """A map's data; the no-endpoints maps are read from filter chains, which may not reach
    a chain that holds a dnat (the kernel refuses that goto: EOPNOTSUPP)."""
    if name.startswith("no-endpoint"):
        return st.sampled_from(("drop", "goto reject-chain"))
    return value(types)


@st.composite
def case(draw, family: int) -> tuple:
    """(family, elements first there, deletes of some of them, adds of new keys)."""
    types = calc_element_types(family)
    first: dict[tuple[str, str], str | None] = {}
    adds: dict[tuple[str, str], str | None] = {}
    for name in draw(st.lists(st.sampled_from(sorted(types)), min_size=1, max_size=6)):
        kind = types[name]
        for target in (first, adds):
            for key in draw(st.lists(value(kind.key), max_size=3)):
                if (name, key) not in first and (name, key) not in adds:
                    target[(name, key)] = draw(data(name, kind.data)) if kind.data else None
    gone = draw(st.lists(st.sampled_from(sorted(first)), unique=True)) if first else []
    as_list = lambda d, keys: [[n, k, d[(n, k)]] for n, k in keys]  # noqa: E731
    return family, as_list(first, first), as_list(first, gone), as_list(adds, adds)


@in_netns_examples(8)
@given(st.lists(case(4), min_size=4, max_size=4), st.lists(case(6), min_size=4, max_size=4))
def test_a_batch_lists_as_the_script_of_the_same_changes(run_cases, v4, v6):
    """Both take the same changes, or both refuse them (the kernel refuses some keys, as an
    all-zero IPv6 concatenation: EOPNOTSUPP to either) and keep the table as it was."""
    for given_case, answer in zip(v4 + v6, run_cases(v4 + v6), strict=True):
        if "unloaded" in answer:  # a first state the kernel refuses: see ``data``
            continue
        script, batch = answer["script"], answer["batch"]
        assert (script["error"] is None) == (batch["error"] is None), given_case
        assert batch["listing"] == script["listing"], given_case


def test_a_refused_batch_applies_nothing(run_cases):
    first = [["service-ips", "10.96.0.1 . tcp . 80", "goto lb-1"]]
    missing = [["hairpin", "10.1.0.1 . 10.1.0.1", None]]
    adds = [["service-ips", "10.96.0.2 . tcp . 80", "goto lb-1"]]
    (answer,) = run_cases([[4, first, missing, adds]])
    assert answer["script"]["error"] and answer["batch"]["error"]
    assert "No such file or directory" in answer["batch"]["error"]
    assert answer["batch"]["listing"] == answer["script"]["listing"]
    service_ips = next(
        o["map"]
        for o in answer["batch"]["listing"]
        if o.get("map", {}).get("name") == "service-ips"
    )
    assert len(service_ips["elem"]) == 1  # the add did not happen


def test_every_entry_kind_has_its_backends_maps_typed():
    types = calc_element_types(4)
    assert all(f"{PREFIX[e]}backends-tcp" in types for e in PREFIX)
    assert not {"cluster-cidrs", "service-cidrs", "firewall-allow"} & set(types)  # intervals


def test_a_batch_of_several_messages_per_set_lists_as_the_script(run_cases):
    """More elements than one message holds (kernel/nftelem.py CHUNK): one batch still."""
    first = [
        ["hairpin", f"10.1.{i // 256}.{i % 256} . 10.1.{i // 256}.{i % 256}", None]
        for i in range(600)
    ]
    deletes = first[:300]
    adds = [
        [
            "backends-tcp",
            f"10.96.{i // 256}.{i % 256} . tcp . 80 . {i % 5}",
            f"10.2.0.{i % 250} . 8080",
        ]
        for i in range(700)
    ]
    (answer,) = run_cases([[4, first, deletes, adds]])
    assert answer["script"]["error"] is None and answer["batch"]["error"] is None
    assert answer["batch"]["listing"] == answer["script"]["listing"]

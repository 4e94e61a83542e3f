"""The masquerade table's attachment elements as netlink batches (``masq/rules.py``
``calc_element_batch``, run by ``MasqTable``) list as nft's own script writes them: in a real
netns, generated attachments (bridge names, IPv4 and IPv6 addresses in their subnets, tags as
comments) are added once through ``render_add`` and once as a batch, and the two listings
must be equal (the interval concatenation ``nomasq`` sets included: key and key end); the
batch that deletes them leaves the table as the script's delete does."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fixtures.netns import in_netns_examples, program_in_netns

pytestmark = pytest.mark.netns
IN_NETNS = """
import ipaddress, json, sys
from kernel.nft import Nft, NftError
from masq import rules

nft = Nft()


def listing():
    doc = nft.list_json(f"list table {rules.FAMILY} {rules.TABLE}")
    return [o for o in doc["nftables"] if "set" in o]


out = []
for attachments in json.loads(sys.stdin.read()):
    elements = [
        e
        for tag, bridge, pairs in attachments
        for e in rules.elements_for(
            tag, bridge, [(ipaddress.ip_address(a), ipaddress.ip_network(n)) for a, n in pairs]
        )
    ]
    nft.run(f"table {rules.FAMILY} {rules.TABLE}\\ndelete table {rules.FAMILY} {rules.TABLE}\\n")
    nft.run(rules.render_cluster([]))
    empty = listing()
    answer = {}
    for path in ("script", "batch"):
        try:
            if path == "script":
                nft.run(rules.render_add(elements))
            else:
                nft.run_elements(rules.calc_element_batch((), elements))
            added = listing()
            if path == "script":
                nft.run(rules.render_delete(elements))
            else:
                nft.run_elements(rules.calc_element_batch(elements, ()))
            answer[path] = {"error": None, "added": added, "deleted": listing() == empty}
        except NftError as exc:
            answer[path] = {"error": str(exc)}
    out.append(answer)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def run_cases():
    yield from program_in_netns("masqel", IN_NETNS)


BRIDGES = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=15).filter(
    lambda name: name not in (".", "..") and not name[0].isdigit()
)


@st.composite
def pair(draw, version: int) -> list[str]:
    """A Pod address and its subnet."""
    prefix = draw(st.integers(8, 30) if version == 4 else st.integers(48, 126))
    address = draw(st.ip_addresses(v=version))
    net = ipaddress.ip_network(f"{address}/{prefix}", strict=False)
    return [str(address), str(net)]


@st.composite
def attachments(draw) -> list:
    """Attachments with distinct tags and distinct addresses per bridge."""
    out, seen = [], set()
    for i in range(draw(st.integers(1, 4))):
        bridge = draw(BRIDGES)
        pairs = [p for v in (4, 6) if draw(st.booleans()) for p in [draw(pair(v))]]
        keys = {(bridge, a) for a, _ in pairs}
        if pairs and not keys & seen:
            seen |= keys
            out.append([f"net/c{i}/eth0", bridge, pairs])
    return out


@in_netns_examples(6)
@given(st.lists(attachments(), min_size=5, max_size=5))
def test_a_batch_lists_as_the_script_of_the_same_attachments(run_cases, cases):
    for given_case, answer in zip(cases, run_cases(cases), strict=True):
        script, batch = answer["script"], answer["batch"]
        assert script["error"] is None, given_case
        assert batch == script, given_case
        assert batch["deleted"], given_case


def test_a_tag_is_listed_as_each_elements_comment(run_cases):
    case = [["net/abc/eth0", "pycni0", [["10.22.0.5", "10.22.0.0/24"], ["fd00::5", "fd00::/64"]]]]
    (answer,) = run_cases([case])
    sets = {o["set"]["name"]: o["set"].get("elem", []) for o in answer["batch"]["added"]}
    for name in ("masq4", "nomasq4", "masq6", "nomasq6"):
        assert [e["elem"]["comment"] for e in sets[name]] == ["net/abc/eth0"], sets[name]

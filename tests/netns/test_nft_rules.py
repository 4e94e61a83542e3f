"""``kernel/nftrule.py`` writes the expressions nft writes: in a real netns, a chain with every
rule shape NetworkPolicy's shape chains use (both families, peers alone, ports alone, named
ports, both, the drop counter's object map, the final counted drop) is made once by nft's
script and once as a netlink batch (``NewChain`` in ``ElementBatch``), and the kernel lists
the two alike; so are chains of rules generated from those shapes' grammar. A rule outside
those shapes is not encoded (the caller keeps the script), and no text makes the encoder
raise."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel.nftrule import encode_rule
from tests.fixtures.netns import in_netns_examples, program_in_netns

pytestmark = pytest.mark.netns
DECLARATIONS = """add table inet t
add set inet t pods4 { type ipv4_addr; }
add set inet t pods6 { type ipv6_addr; }
add set inet t ports { type inet_proto . inet_service; flags interval; }
add set inet t named4 { type ipv4_addr . inet_proto . inet_service; }
add set inet t named6 { type ipv6_addr . inet_proto . inet_service; }
add set inet t blocks4 { type ipv4_addr; flags interval; }
add set inet t blocks6 { type ipv6_addr; flags interval; }
add map inet t dropcnt-in4 { type ipv4_addr : counter; }
add map inet t dropcnt-in6 { type ipv6_addr : counter; }
"""
RULES = [
    "ip saddr @pods4 meta l4proto . th dport @ports return",
    "ip saddr @pods4 ip daddr . meta l4proto . th dport @named4 return",
    "ip6 saddr @pods6 ip6 daddr . meta l4proto . th dport @named6 return",
    "ip6 saddr @pods6 meta l4proto . th dport @ports return",
    "ip daddr @pods4 return",
    "ip6 daddr @pods6 return",
    "ip daddr @blocks4 meta l4proto . th dport @ports return",
    "ip6 daddr @blocks6 return",
    "meta l4proto . th dport @ports return",
    "ip daddr . meta l4proto . th dport @named4 return",
    "ip6 daddr . meta l4proto . th dport @named6 return",
    "return",
    "counter name ip daddr map @dropcnt-in4",
    "counter name ip saddr map @dropcnt-in4",
    "counter name ip6 daddr map @dropcnt-in6",
    "counter drop",
]
IN_NETNS = """
import json, sys
from kernel.nft import Nft
from kernel.nftelem import ElementBatch, NewChain
from kernel.nftrule import encode_rule

declarations, rules = json.loads(sys.stdin.read())
nft = Nft()
nft.run("table inet t\\ndelete table inet t\\n")  # an earlier case's, in this netns


def listing():
    doc = nft.list_json("list table inet t")
    return [o["rule"]["expr"] for o in doc["nftables"] if "rule" in o]


made = "".join(f"add rule inet t c {r}\\n" for r in rules)
nft.run(declarations + "add chain inet t c\\n" + made)
script = listing()
nft.run("delete table inet t\\n" + declarations)
chain = NewChain("c", tuple(rules), tuple(encode_rule(r) for r in rules))
nft.run_elements(ElementBatch("inet", "t", (), chains=(chain,)))
print(json.dumps({"script": script, "batch": listing()}))
"""


@pytest.fixture(scope="module")
def run_case():
    yield from program_in_netns("rules", IN_NETNS)


def test_every_shape_lists_as_nfts_own(run_case):
    answer = run_case([DECLARATIONS, RULES])
    assert len(answer["script"]) == len(RULES)
    for rule, ours, nfts in zip(RULES, answer["batch"], answer["script"], strict=True):
        assert ours == nfts, rule


@pytest.mark.parametrize(
    "rule",
    [
        "ip saddr @pods4 accept comment x",
        "tcp dport 80 return",
        "ip saddr 10.0.0.1 return",
        "jump elsewhere",
        "ip saddr . ip daddr @pairs accept",
        "counter name ip daddr map @m drop",
    ],
)
def test_a_rule_outside_the_shapes_is_not_encoded(rule):
    assert encode_rule(rule) is None


@st.composite
def shaped_rule(draw) -> str:
    """A rule of the shapes: an address term, then a ports or named-port term (each
    optional), then a verdict; or the object map's counter; or the counted drop."""
    kind = draw(st.sampled_from(["terms", "objref", "counter"]))
    family = draw(st.sampled_from(["ip", "ip6"]))
    v = "4" if family == "ip" else "6"
    which = draw(st.sampled_from(["saddr", "daddr"]))
    if kind == "objref":
        return f"counter name {family} {which} map @dropcnt-in{v}"
    if kind == "counter":
        return "counter drop"
    terms = []
    if draw(st.booleans()):
        peers = draw(st.sampled_from([f"pods{v}", f"blocks{v}"]))
        terms.append(f"{family} {which} @{peers}")
    ports = draw(st.sampled_from(["", "ports", "named"]))
    if ports == "ports":
        terms.append("meta l4proto . th dport @ports")
    elif ports == "named":
        terms.append(f"{family} daddr . meta l4proto . th dport @named{v}")
    return " ".join([*terms, draw(st.sampled_from(["return", "drop", "accept"]))])


@in_netns_examples(6)
@given(st.lists(shaped_rule(), min_size=1, max_size=12))
def test_generated_rules_of_the_shapes_list_as_nfts_own(run_case, rules):
    assert all(encode_rule(rule) is not None for rule in rules), rules
    answer = run_case([DECLARATIONS, rules])
    assert answer["batch"] == answer["script"], rules


@given(st.text(max_size=80) | shaped_rule().map(lambda r: r.replace(" ", "  ", 1)))
def test_no_text_makes_the_encoder_raise(text):
    found = encode_rule(text)
    assert found is None or isinstance(found, bytes)

"""The masquerade table in a real nft: what render_* writes is what parse_elements reads back,
for generated bridge names and addresses."""

from __future__ import annotations

import ipaddress
import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from masq.rules import (
    SET_TYPES,
    TABLE,
    elements_for,
    is_legacy,
    parse_elements,
    render_add,
    render_table,
)

pytestmark = pytest.mark.netns
NAMES = st.text(
    st.characters(blacklist_characters='"\\*', blacklist_categories=("Cc", "Cs", "Z")),
    min_size=1,
    max_size=15,
).filter(lambda n: n.isprintable() and len(n.encode()) <= 15)
PAIRS = st.lists(
    st.ip_addresses().flatmap(
        lambda a: st.tuples(
            st.just(a),
            st.integers(8, a.max_prefixlen).map(
                lambda n: ipaddress.ip_network(f"{a}/{n}", strict=False)
            ),
        )
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda p: p[0],
)


@pytest.fixture
def scratch(netns_factory):
    return netns_factory("nft")


def listed(ns) -> dict:
    return json.loads(ns.run(["nft", "-j", "list", "table", "inet", TABLE]).stdout)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@example(
    name="10.0.0.1",
    pairs=[(ipaddress.ip_address("10.0.0.1"), ipaddress.ip_network("10.0.0.0/24"))],
)
@given(name=NAMES, pairs=PAIRS)
def test_rendered_elements_read_back_from_the_kernel(scratch, name, pairs):
    wanted = elements_for("net/c1/eth0", name, pairs)
    flush = "".join(f"flush set inet {TABLE} {name}\n" for name in SET_TYPES)
    scratch.run(["nft", "-f", "-"], input=render_table() + flush + render_add(wanted))
    doc = listed(scratch)
    assert not is_legacy(doc)
    assert {(e.set, e.key, e.tag) for e in parse_elements(doc)} == {
        (e.set, e.key, e.tag) for e in wanted
    }

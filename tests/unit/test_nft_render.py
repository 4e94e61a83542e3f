"""Masquerade rule rendering (golden files) and reading back real `nft -j` output.

Regenerate the golden files after an intended change with PYCNI_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import ipaddress
import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni.spec.errors import InvalidConfig
from masq.rules import (
    Element,
    elements_for,
    ifname_literal,
    is_legacy,
    key_text,
    migrate_elements,
    parse_elements,
    render_add,
    render_delete,
    render_migration,
    render_table,
)
from tests.fixtures.golden import GOLDEN, golden

PAIRS = [
    (ipaddress.ip_address("10.22.0.2"), ipaddress.ip_network("10.22.0.0/24")),
    (ipaddress.ip_address("fd00::2"), ipaddress.ip_network("fd00::/64")),
]


def test_static_table_matches_golden():
    text = render_table()
    assert text == golden("masq_table.nft", text)


def test_attachment_transaction_matches_golden():
    elements = elements_for("podnet/c1/eth0", "pycni0", PAIRS)
    text = render_delete(elements_for("podnet/old/eth0", "pycni0", PAIRS[:1])) + render_add(
        elements
    )
    assert text == golden("masq_attach.nft", text)


def test_migration_transaction_matches_golden():
    text = render_migration(elements_for("podnet/c1/eth0", "pycni0", PAIRS[:1]))
    assert text == golden("masq_migrate.nft", text)
    assert text.startswith("delete table inet pycni-masq\n" + render_table())


def test_elements_of_an_attachment_are_keyed_by_its_bridge():
    assert elements_for("podnet/c1/eth0", "pycni0", PAIRS) == [
        Element("masq4", '"pycni0" . 10.22.0.2'),
        Element("nomasq4", '"pycni0" . 10.22.0.2 . 10.22.0.0/24'),
        Element("masq6", '"pycni0" . fd00::2'),
        Element("nomasq6", '"pycni0" . fd00::2 . fd00::/64'),
    ]
    host_route = elements_for(
        "t", "br0", [(ipaddress.ip_address("10.22.0.3"), ipaddress.ip_network("10.22.0.3/32"))]
    )
    assert host_route[1].key == '"br0" . 10.22.0.3 . 10.22.0.3'  # as nft prints a /32
    other_bridge = elements_for("podnet/c1/eth0", "pycni1", PAIRS)
    assert not set(other_bridge) & set(elements_for("podnet/c1/eth0", "pycni0", PAIRS))


@pytest.mark.parametrize("name", ['a"b', "a\\b", "br*", "a\x01b", ""])
def test_a_bridge_name_nft_cannot_express_is_refused(name):
    with pytest.raises(InvalidConfig) as refused:
        elements_for("t", name, PAIRS)
    assert refused.value.code == 7 and refused.value.msg == "invalid key 'bridge'"


def test_tag_is_not_part_of_identity():
    assert Element("masq4", "10.22.0.2", "a") == Element("masq4", "10.22.0.2", "b")


def read_golden(name: str) -> dict:
    with open(os.path.join(GOLDEN, name)) as fh:
        return json.load(fh)


def test_parse_real_nft_json():
    doc = read_golden("masq_list.json")  # `nft -j list table` of what render_* wrote
    found = {(e.set, e.key, e.tag) for e in parse_elements(doc)}
    assert found == {
        ("masq4", '"pycni0" . 10.22.0.2', "podnet/c1/eth0"),
        ("masq4", '"pycni1" . 10.22.0.2', "other/c2/eth0"),
        ("masq4", '"pycni0" . 10.22.0.3', "podnet/c3/eth0"),
        ("masq4", '"pycni0" . 10.22.0.99', None),
        ("nomasq4", '"pycni0" . 10.22.0.2 . 10.22.0.0/24', "podnet/c1/eth0"),
        ("nomasq4", '"pycni1" . 10.22.0.2 . 10.22.0.0/24', "other/c2/eth0"),
        ("nomasq4", '"pycni0" . 10.22.0.3 . 10.22.0.3', "podnet/c3/eth0"),
        ("masq6", '"pycni0" . fd00::2', "podnet/c1/eth0"),
        ("nomasq6", '"pycni0" . fd00::2 . fd00::/64', "podnet/c1/eth0"),
    }
    rendered = {(e.set, e.key) for e in elements_for("podnet/c1/eth0", "pycni0", PAIRS)}
    assert rendered <= {(s, k) for s, k, _ in found}  # what we write is what we read back
    assert not is_legacy(doc)


def test_legacy_layout_is_recognised_and_migrated():
    doc = read_golden("masq_list_legacy.json")  # as the address-keyed layout listed
    assert is_legacy(doc)
    kept = migrate_elements(parse_elements(doc), {"podnet/c1/eth0": "pycni0", "x/y/eth0": "br9"})
    assert {(e.set, e.key, e.tag) for e in kept} == {
        ("masq4", '"pycni0" . 10.22.0.2', "podnet/c1/eth0"),
        ("nomasq4", '"pycni0" . 10.22.0.2 . 10.22.0.0/24', "podnet/c1/eth0"),
        ("masq6", '"pycni0" . fd00::2', "podnet/c1/eth0"),
        ("nomasq6", '"pycni0" . fd00::2 . fd00::/64', "podnet/c1/eth0"),
    }
    assert set(kept) == set(elements_for("podnet/c1/eth0", "pycni0", PAIRS))  # CHECK agrees


@pytest.mark.parametrize(
    "value,text",
    [
        ("10.0.0.1", "10.0.0.1"),
        ("FD00:0:0::1", "fd00::1"),
        ({"prefix": {"addr": "10.0.0.0", "len": 8}}, "10.0.0.0/8"),
        (
            {"concat": ["10.0.0.1", {"prefix": {"addr": "10.0.0.0", "len": 8}}]},
            "10.0.0.1 . 10.0.0.0/8",
        ),
        ({"range": ["10.0.0.1", "10.0.0.9"]}, "10.0.0.1-10.0.0.9"),
        ({"concat": ["pycni0", "10.0.0.1"]}, '"pycni0" . 10.0.0.1'),
    ],
)
def test_key_text(value, text):
    assert key_text(value) == text


def test_other_tables_are_ignored():
    doc = {"nftables": [{"set": {"table": "kube-proxy", "name": "masq4", "elem": ["10.0.0.1"]}}]}
    assert parse_elements(doc) == []


NAMES = st.text(
    st.characters(blacklist_characters='"\\*', blacklist_categories=("Cc", "Cs")),
    min_size=1,
    max_size=15,
).filter(str.isprintable)


@given(NAMES, st.ip_addresses(), st.integers(0, 128))
def test_rendered_keys_read_back_as_written(name, address, prefixlen):
    """What nft -j prints for our elements (concat of name, address, prefix) parses back to
    the key we rendered, for any interface name nft can express."""
    subnet = ipaddress.ip_network(
        f"{address}/{min(prefixlen, address.max_prefixlen)}", strict=False
    )
    masq, nomasq = elements_for("t", name, [(address, subnet)])
    net = {"prefix": {"addr": str(subnet.network_address), "len": subnet.prefixlen}}
    if subnet.prefixlen == subnet.max_prefixlen:
        net = str(subnet.network_address)
    addr_type = f"ipv{address.version}_addr"
    assert key_text({"concat": [name, str(address)]}, ["ifname", addr_type]) == masq.key
    assert (
        key_text({"concat": [name, str(address), net]}, ["ifname", addr_type, addr_type])
        == nomasq.key
    )
    assert ifname_literal(name) == f'"{name}"'


@given(st.text(max_size=20))
def test_any_bridge_name_is_rendered_or_refused_with_code_7(name):
    try:
        elements = elements_for("t", name, PAIRS)
    except InvalidConfig as exc:
        assert exc.code == 7 and "bridge" in exc.msg
    else:
        assert all(e.key.startswith(f'"{name}" . ') for e in elements)

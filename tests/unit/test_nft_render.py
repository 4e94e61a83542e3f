"""Masquerade rule rendering (golden files) and reading back real `nft -j` output.

Regenerate the golden files after an intended change with PYCNI_UPDATE_GOLDEN=1.
"""
from __future__ import annotations

import ipaddress
import json
import os

import pytest

from cni.plugins.masq_rules import (Element, elements_for, key_text, parse_elements,
                                    render_add, render_delete, render_table)

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
PAIRS = [(ipaddress.ip_address("10.22.0.2"), ipaddress.ip_network("10.22.0.0/24")),
         (ipaddress.ip_address("fd00::2"), ipaddress.ip_network("fd00::/64"))]


def golden(name: str, text: str) -> str:
    path = os.path.join(GOLDEN, name)
    if os.environ.get("PYCNI_UPDATE_GOLDEN"):
        with open(path, "w") as fh:
            fh.write(text)
    with open(path) as fh:
        return fh.read()


def test_static_table_matches_golden():
    text = render_table()
    assert text == golden("masq_table.nft", text)


def test_attachment_transaction_matches_golden():
    elements = elements_for("podnet/c1/eth0", PAIRS)
    text = render_delete(elements_for("podnet/old/eth0", PAIRS[:1])) + render_add(elements)
    assert text == golden("masq_attach.nft", text)


def test_elements_of_an_attachment():
    assert elements_for("podnet/c1/eth0", PAIRS) == [
        Element("masq4", "10.22.0.2"), Element("nomasq4", "10.22.0.2 . 10.22.0.0/24"),
        Element("masq6", "fd00::2"), Element("nomasq6", "fd00::2 . fd00::/64")]
    host_route = elements_for("t", [(ipaddress.ip_address("10.22.0.3"),
                                     ipaddress.ip_network("10.22.0.3/32"))])
    assert host_route[1].key == "10.22.0.3 . 10.22.0.3"  # as nft prints a full-length prefix


def test_tag_is_not_part_of_identity():
    assert Element("masq4", "10.22.0.2", "a") == Element("masq4", "10.22.0.2", "b")


def test_parse_real_nft_json():
    with open(os.path.join(GOLDEN, "masq_list.json")) as fh:
        doc = json.load(fh)
    found = {(e.set, e.key, e.tag) for e in parse_elements(doc)}
    assert found == {
        ("masq4", "10.22.0.2", "podnet/c1/eth0"), ("masq4", "10.22.0.3", "podnet/c2/eth0"),
        ("masq4", "10.22.0.99", None),
        ("nomasq4", "10.22.0.2 . 10.22.0.0/24", "podnet/c1/eth0"),
        ("nomasq4", "10.22.0.3 . 10.22.0.3", "podnet/c2/eth0"),
        ("masq6", "fd00::2", "podnet/c1/eth0"),
        ("nomasq6", "fd00::2 . fd00::/64", "podnet/c1/eth0")}
    rendered = {(e.set, e.key) for e in elements_for("podnet/c1/eth0", PAIRS)}
    assert rendered <= {(s, k) for s, k, _ in found}  # what we write is what we read back


@pytest.mark.parametrize("value,text", [
    ("10.0.0.1", "10.0.0.1"), ("FD00:0:0::1", "fd00::1"),
    ({"prefix": {"addr": "10.0.0.0", "len": 8}}, "10.0.0.0/8"),
    ({"concat": ["10.0.0.1", {"prefix": {"addr": "10.0.0.0", "len": 8}}]}, "10.0.0.1 . 10.0.0.0/8"),
    ({"range": ["10.0.0.1", "10.0.0.9"]}, "10.0.0.1-10.0.0.9")])
def test_key_text(value, text):
    assert key_text(value) == text


def test_other_tables_are_ignored():
    doc = {"nftables": [{"set": {"table": "kube-proxy", "name": "masq4", "elem": ["10.0.0.1"]}}]}
    assert parse_elements(doc) == []

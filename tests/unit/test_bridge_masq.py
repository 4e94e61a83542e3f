"""Masquerader policy over an in-memory nft (the privileged edge faked, knftables style).

The fake applies our own element commands atomically (a transaction that deletes a missing
element fails as a whole, as nft does) and lists sets in nft's JSON shape.
"""
from __future__ import annotations

import ipaddress
import re

import pytest

from cni.net.nft import NftError
from cni.plugins.masq import Masquerader

ELEMENT = re.compile(r'^(add|delete) element inet pycni-masq (\w+) \{ (.+?)(?: comment "(.*)")? \}$')
PAIR = [(ipaddress.ip_address("10.22.0.2"), ipaddress.ip_network("10.22.0.0/24"))]
OTHER = [(ipaddress.ip_address("10.22.0.3"), ipaddress.ip_network("10.22.0.0/24"))]


class FakeNft:
    def __init__(self) -> None:
        self.table = False
        self.sets: dict[str, dict[str, str | None]] = {}
        self.scripts: list[str] = []
        self.lists = 0

    def run(self, script: str) -> None:
        self.scripts.append(script)
        table, sets = self.table, {k: dict(v) for k, v in self.sets.items()}
        for line in script.splitlines():
            if line.startswith("add table"):
                table = True
                for name in ("masq4", "nomasq4", "masq6", "nomasq6"):
                    sets.setdefault(name, {})
            elif m := ELEMENT.match(line):
                verb, name, key, tag = m.groups()
                if not table:
                    raise NftError("No such file or directory (table)")
                if verb == "add":
                    sets[name].setdefault(key, tag)
                elif key not in sets[name]:
                    raise NftError(f"No such file or directory: {line}")
                else:
                    del sets[name][key]
        self.table, self.sets = table, sets

    def list_json(self, command: str) -> dict:
        self.lists += 1
        if command.startswith("list tables"):
            return {"nftables": [{"table": {"family": "inet", "name": "pycni-masq"}}] if self.table else []}
        return {"nftables": [{"set": {"table": "pycni-masq", "name": name,
                                      "elem": [{"elem": {"val": _val(k), "comment": t}} for k, t in elems.items()]}}
                             for name, elems in self.sets.items()]}

    def tags(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for name, elems in self.sets.items():
            for key, tag in elems.items():
                out.setdefault(tag, set()).add(f"{name}:{key}")
        return out


def _val(key: str):
    if " . " in key:
        addr, net = key.split(" . ")
        if "/" in net:
            a, n = net.split("/")
            return {"concat": [addr, {"prefix": {"addr": a, "len": int(n)}}]}
        return {"concat": [addr, net]}
    return key


@pytest.fixture
def nft() -> FakeNft:
    return FakeNft()


def test_first_add_creates_the_table_in_the_same_transaction(nft):
    Masquerader(nft).add("net/c1/eth0", PAIR)
    assert len(nft.scripts) == 1 and nft.scripts[0].startswith("add table inet pycni-masq")
    assert nft.tags() == {"net/c1/eth0": {"masq4:10.22.0.2", "nomasq4:10.22.0.2 . 10.22.0.0/24"}}


def test_later_adds_and_removes_are_element_only_and_need_no_listing(nft):
    masq = Masquerader(nft)
    masq.add("net/c1/eth0", PAIR)
    lists = nft.lists
    masq.add("net/c2/eth0", OTHER)
    masq.remove("net/c1/eth0")
    assert nft.lists == lists
    assert all(not s.startswith("add table") for s in nft.scripts[1:])
    assert set(nft.tags()) == {"net/c2/eth0"}


def test_remove_of_an_unknown_tag_is_a_no_op(nft):
    Masquerader(nft).remove("net/never/eth0")
    assert nft.scripts == [] and not nft.table


def test_an_address_held_by_a_stale_attachment_is_taken_over_whole(nft):
    masq = Masquerader(nft)
    masq.add("net/dead/eth0", PAIR)
    masq.add("net/new/eth0", PAIR)
    assert set(nft.tags()) == {"net/new/eth0"}


def test_drift_is_repaired_by_rereading_the_kernel(nft):
    masq = Masquerader(nft)
    masq.add("net/c1/eth0", PAIR)
    masq.add("net/c2/eth0", OTHER)
    del nft.sets["masq4"]["10.22.0.2"]  # someone removed one element behind our back
    masq.remove("net/c1/eth0")
    assert set(nft.tags()) == {"net/c2/eth0"}
    nft.table, nft.sets = False, {}  # the whole table removed
    masq.add("net/c3/eth0", PAIR)
    assert set(nft.tags()) == {"net/c3/eth0"}


def test_a_fresh_daemon_finds_elements_made_before_it(nft):
    Masquerader(nft).add("net/c1/eth0", PAIR)
    Masquerader(nft).remove("net/c1/eth0")
    assert nft.tags() == {}


def test_elements_reads_the_kernel(nft):
    masq = Masquerader(nft)
    masq.add("net/c1/eth0", PAIR)
    del nft.sets["nomasq4"]["10.22.0.2 . 10.22.0.0/24"]
    assert {e.set for e in masq.elements("net/c1/eth0")} == {"masq4"}


def test_collect_removes_rejected_tags_and_reports_errors(nft):
    masq = Masquerader(nft)
    for tag, pair in (("net/a/eth0", PAIR), ("net/b/eth0", OTHER)):
        masq.add(tag, pair)
    assert masq.collect(lambda tag: tag == "net/a/eth0") == []
    assert set(nft.tags()) == {"net/a/eth0"}

    def failing(script: str) -> None:
        raise NftError("busy")
    nft.run = failing
    errors = masq.collect(lambda tag: False)
    assert len(errors) == 1 and "net/a/eth0" in errors[0] and "busy" in errors[0]

"""MasqTable policy over an in-memory nft (the privileged edge faked, knftables style).

The fake applies our own element commands atomically (a transaction that deletes a missing
element fails as a whole, as nft does) and lists sets in nft's JSON shape; it can start with a
table in the legacy layout (sets keyed by the address alone).
"""

from __future__ import annotations

import ipaddress
import re

import pytest

from cni.spec.errors import AddressConflict
from kernel.nft import NftError
from kernel.nftelem import ElementBatch
from masq.rules import SET_TYPES
from masq.table import MasqTable

ELEMENT = re.compile(
    r'^(add|delete) element inet pycni-masq (\w+) \{ (.+?)(?: comment "(.*)")? \}$'
)
PAIR = [(ipaddress.ip_address("10.22.0.2"), ipaddress.ip_network("10.22.0.0/24"))]
OTHER = [(ipaddress.ip_address("10.22.0.3"), ipaddress.ip_network("10.22.0.0/24"))]


LEGACY_TYPES = {
    "masq4": "ipv4_addr",
    "nomasq4": ["ipv4_addr", "ipv4_addr"],
    "masq6": "ipv6_addr",
    "nomasq6": ["ipv6_addr", "ipv6_addr"],
}


class FakeNft:
    def __init__(self) -> None:
        self.table = False
        self.sets: dict[str, dict[str, str | None]] = {}
        self.types: dict = dict(SET_TYPES)
        self.scripts: list[str] = []
        self.batches: list[ElementBatch] = []  # each also in ``scripts``, as its commands
        self.lists = 0

    def legacy(self, elements: dict[str, dict[str, str | None]]) -> None:
        """Start with a table as the address-keyed layout left it."""
        self.table, self.sets, self.types = True, elements, dict(LEGACY_TYPES)

    def run(self, script: str) -> None:
        self.scripts.append(script)
        table, sets, types = self.table, {k: dict(v) for k, v in self.sets.items()}, self.types
        for line in script.splitlines():
            if line.startswith("delete table"):
                table, sets, types = False, {}, dict(SET_TYPES)
            elif line.startswith("add table"):
                table = True
                for name in SET_TYPES:
                    sets.setdefault(name, {})
            elif line.startswith("add set") and types != SET_TYPES:
                raise NftError("datatype mismatch")  # what nft says about the legacy sets
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
        self.table, self.sets, self.types = table, sets, types

    def run_elements(self, batch: ElementBatch) -> None:
        """The batch as the element commands it stands for, one per element (one
        transaction: all or nothing, as ``run``)."""
        assert (batch.family, batch.table) == ("inet", "pycni-masq") and not batch.removals
        lines = []
        for change in batch.changes:
            comments = change.comments or ("",) * len(change.elements)
            for (key, _data), tag in zip(change.elements, comments, strict=True):
                note = f' comment "{tag}"' if tag else ""
                lines.append(
                    f"{change.verb} element inet pycni-masq {change.set} {{ {key}{note} }}"
                )
        self.batches.append(batch)
        self.run("\n".join(lines) + "\n")

    def list_json(self, command: str, terse: bool = False) -> dict:
        self.lists += 1
        if not self.table:
            raise NftError(f"Error: No such file or directory\n{command}")
        if terse:
            return {"nftables": [{"table": {"family": "inet", "name": "pycni-masq"}}]}
        return {
            "nftables": [
                {
                    "set": {
                        "table": "pycni-masq",
                        "name": name,
                        "type": self.types[name],
                        "elem": [
                            {"elem": {"val": _val(k), "comment": t}} for k, t in elems.items()
                        ],
                    }
                }
                for name, elems in self.sets.items()
            ]
        }

    def tags(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for name, elems in self.sets.items():
            for key, tag in elems.items():
                out.setdefault(tag, set()).add(f"{name}:{key}")
        return out


def _val(key: str):
    """A key as nft -j prints it: concatenations, prefixes, interface names unquoted."""
    parts = [_part(p) for p in key.split(" . ")]
    return {"concat": parts} if len(parts) > 1 else parts[0]


def _part(text: str):
    if "/" in text:
        a, n = text.split("/")
        return {"prefix": {"addr": a, "len": int(n)}}
    return text.strip('"')


class Veths:
    """The live attachments (tag -> bridge of its host veth) the MasqTable asks about."""

    def __init__(self) -> None:
        self.live: dict[str, str] = {}
        self.asked = 0

    def __call__(self) -> dict[str, str]:
        self.asked += 1
        return dict(self.live)


@pytest.fixture
def nft() -> FakeNft:
    return FakeNft()


@pytest.fixture
def veths() -> Veths:
    return Veths()


def masquerader(nft: FakeNft, veths: Veths | None = None) -> MasqTable:
    return MasqTable(nft, veths or Veths())


def test_first_add_creates_the_table_in_the_same_transaction(nft):
    masquerader(nft).add("net/c1/eth0", "br0", PAIR)
    assert len(nft.scripts) == 1 and nft.scripts[0].startswith("add table inet pycni-masq")
    assert nft.tags() == {
        "net/c1/eth0": {'masq4:"br0" . 10.22.0.2', 'nomasq4:"br0" . 10.22.0.2 . 10.22.0.0/24'}
    }


def test_later_adds_and_removes_are_element_only_and_need_no_listing(nft):
    masq = masquerader(nft)
    masq.add("net/c1/eth0", "br0", PAIR)
    lists = nft.lists
    masq.add("net/c2/eth0", "br0", OTHER)
    masq.remove("net/c1/eth0")
    assert nft.lists == lists
    assert all(not s.startswith("add table") for s in nft.scripts[1:])
    assert len(nft.batches) == 2 == len(nft.scripts) - 1  # netlink batches, not scripts
    assert set(nft.tags()) == {"net/c2/eth0"}


def test_remove_of_an_unknown_tag_is_a_no_op(nft):
    masquerader(nft).remove("net/never/eth0")
    assert nft.scripts == [] and not nft.table


def test_an_address_held_by_a_stale_attachment_is_taken_over_whole(nft, veths):
    masq = masquerader(nft, veths)
    masq.add(
        "net/dead/eth0",
        "br0",
        PAIR + [(ipaddress.ip_address("fd00::2"), ipaddress.ip_network("fd00::/64"))],
    )
    veths.live = {"net/new/eth0": "br0"}  # net/dead has no host veth any more
    masq.add("net/new/eth0", "br0", PAIR)
    assert set(nft.tags()) == {"net/new/eth0"}


def test_the_same_address_on_two_bridges_is_two_attachments(nft, veths):
    masq = masquerader(nft, veths)
    masq.add("a/c1/eth0", "br-a", PAIR)
    masq.add("b/c2/eth0", "br-b", PAIR)
    assert set(nft.tags()) == {"a/c1/eth0", "b/c2/eth0"}
    assert veths.asked == 0  # no overlap, nothing to ask
    masq.remove("b/c2/eth0")
    assert nft.tags() == {
        "a/c1/eth0": {'masq4:"br-a" . 10.22.0.2', 'nomasq4:"br-a" . 10.22.0.2 . 10.22.0.0/24'}
    }


def test_the_same_address_on_one_bridge_is_refused_while_its_holder_lives(nft, veths):
    masq = masquerader(nft, veths)
    masq.add("a/c1/eth0", "br0", PAIR)
    veths.live = {"a/c1/eth0": "br0", "b/c2/eth0": "br0"}
    before, scripts = nft.tags(), len(nft.scripts)
    with pytest.raises(AddressConflict) as refused:
        masq.add("b/c2/eth0", "br0", PAIR)
    assert refused.value.code == 102
    assert refused.value.msg == (
        "address 10.22.0.2 on bridge br0 is already used by attachment a/c1/eth0"
    )
    assert nft.tags() == before and len(nft.scripts) == scripts


def test_a_legacy_table_is_rewritten_keeping_live_attachments(nft, veths):
    nft.legacy(
        {
            "masq4": {"10.22.0.2": "a/c1/eth0", "10.22.0.3": "a/gone/eth0", "10.22.0.9": None},
            "nomasq4": {
                "10.22.0.2 . 10.22.0.0/24": "a/c1/eth0",
                "10.22.0.3 . 10.22.0.0/24": "a/gone/eth0",
            },
            "masq6": {},
            "nomasq6": {},
        }
    )
    veths.live = {"a/c1/eth0": "br0", "b/c2/eth0": "br1"}
    masq = masquerader(nft, veths)
    masq.add("b/c2/eth0", "br1", PAIR)
    assert nft.types == SET_TYPES
    assert nft.tags() == {
        "a/c1/eth0": {'masq4:"br0" . 10.22.0.2', 'nomasq4:"br0" . 10.22.0.2 . 10.22.0.0/24'},
        "b/c2/eth0": {'masq4:"br1" . 10.22.0.2', 'nomasq4:"br1" . 10.22.0.2 . 10.22.0.0/24'},
    }
    assert nft.scripts[0].startswith("delete table inet pycni-masq\n")  # one transaction


def test_a_legacy_table_is_rewritten_by_check_too(nft, veths):
    nft.legacy({"masq4": {"10.22.0.2": "a/c1/eth0"}, "nomasq4": {}, "masq6": {}, "nomasq6": {}})
    veths.live = {"a/c1/eth0": "br0"}
    assert {e.key for e in masquerader(nft, veths).elements("a/c1/eth0")} == {'"br0" . 10.22.0.2'}


def test_drift_is_repaired_by_rereading_the_kernel(nft):
    masq = masquerader(nft)
    masq.add("net/c1/eth0", "br0", PAIR)
    masq.add("net/c2/eth0", "br0", OTHER)
    del nft.sets["masq4"]['"br0" . 10.22.0.2']  # someone removed one element behind our back
    masq.remove("net/c1/eth0")
    assert set(nft.tags()) == {"net/c2/eth0"}
    nft.table, nft.sets = False, {}  # the whole table removed
    masq.add("net/c3/eth0", "br0", PAIR)
    assert set(nft.tags()) == {"net/c3/eth0"}


def test_a_fresh_daemon_finds_elements_made_before_it(nft):
    masquerader(nft).add("net/c1/eth0", "br0", PAIR)
    masquerader(nft).remove("net/c1/eth0")
    assert nft.tags() == {}


def test_elements_reads_the_kernel(nft):
    masq = masquerader(nft)
    masq.add("net/c1/eth0", "br0", PAIR)
    del nft.sets["nomasq4"]['"br0" . 10.22.0.2 . 10.22.0.0/24']
    assert {e.set for e in masq.elements("net/c1/eth0")} == {"masq4"}


def test_collect_removes_rejected_tags_and_reports_errors(nft):
    masq = masquerader(nft)
    for tag, pair in (("net/a/eth0", PAIR), ("net/b/eth0", OTHER)):
        masq.add(tag, "br0", pair)
    assert masq.collect(lambda tag: tag == "net/a/eth0") == []
    assert set(nft.tags()) == {"net/a/eth0"}

    def failing(script: str) -> None:
        raise NftError("busy")

    nft.run = failing
    errors = masq.collect(lambda tag: False)
    assert len(errors) == 1 and "net/a/eth0" in errors[0] and "busy" in errors[0]

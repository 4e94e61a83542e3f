"""``Nft.counters`` (NetworkPolicy's drop counters) in a real netns: one netlink dump of a
table's named counters gives what ``nft -j list counters`` lists for it, name by name, with
their packets and bytes; a counter of another table or family is not in it, a table that
is not there gives none, and thousands of counters (several dump messages and reads) all
come back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.netns import new_netns

pytestmark = pytest.mark.netns
ROOT = Path(__file__).resolve().parents[2]
IN_NETNS = """
import json, subprocess, sys
from kernel.nft import Nft
script, table = json.loads(sys.stdin.read())
nft = Nft()
nft.run(script)
listed = json.loads(subprocess.run(
    ["nft", "-j", "list", "counters", "table", "inet", table],
    capture_output=True, text=True, check=True,
).stdout)
print(json.dumps({
    "dumped": nft.counters("inet", table),
    "listed": {c["counter"]["name"]: [c["counter"]["packets"], c["counter"]["bytes"]]
               for c in listed["nftables"] if "counter" in c},
    "missing": nft.counters("inet", "pycni-no-such-table"),
}))
nft.run(f"delete table inet {table}\\ndelete table ip other\\n")
"""
NAMES = st.builds(  # as nft takes a name unquoted: a letter first, and a '/' (as in
    # dropped-in/<ns>/<pod>): a bare word may be one of nft's keywords, which it refuses as a
    # name ('ah', 'fib', 'add'), and a quoted name is refused too
    lambda first, word, rest: f"{first}{word}/{rest}",
    st.sampled_from("abcdefghij"),
    st.text("abcdefghij0123456789-", max_size=19),
    st.text("abcdefghij0123456789-/", max_size=19),
)
VALUES = st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))


def run(counters: dict[str, tuple[int, int]], table: str = "pycni-counters") -> dict:
    script = f"add table inet {table}\nadd table ip other\nadd counter ip other stray\n"
    script += "".join(
        f"add counter inet {table} {name} {{ packets {p} bytes {b} }}\n"
        for name, (p, b) in counters.items()
    )
    ns = new_netns("ctr")
    try:
        out = subprocess.run(
            ["ip", "netns", "exec", ns.name, sys.executable, "-c", IN_NETNS],
            input=json.dumps([script, table]), capture_output=True, text=True, cwd=ROOT,
            check=True,
        )  # fmt: skip
        return json.loads(out.stdout)
    finally:
        ns.delete()


@settings(max_examples=10, deadline=None)
@given(st.dictionaries(NAMES, VALUES, max_size=12))
def test_the_dump_gives_what_nft_lists(counters: dict[str, tuple[int, int]]) -> None:
    found = run(counters)
    assert found["dumped"] == found["listed"] == {k: list(v) for k, v in counters.items()}
    assert found["missing"] == {}


def test_thousands_of_counters_come_back_whole() -> None:
    counters = {f"dropped-in/ns{i % 100}/pod-{i}": (i, 60 * i) for i in range(3000)}
    found = run(counters)
    assert found["dumped"] == {k: list(v) for k, v in counters.items()}

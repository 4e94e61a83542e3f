"""The names pycnid lists in nftables cost what the names cost, not what the kernel holds.

libnftables (1.0.6) reads the ruleset into the context's cache before it answers, and for
``list tables`` and a non-terse ``list sets`` it reads every element of every set: with the
proxy's table at 10k Services (~70k elements) each kept ~100 MiB in the context and took
~1.5 s. A restarted pycnid met that table twice before its first pass: the masquerade table's
``table_exists`` (overlay sync) and the proxy's ``calc_chains``. Here, in a real netns holding
a large table, both answer right and the process's peak (VmHWM) stays small, with the kept
context and with the binary (``nft -j -t``: there the cost would be the child's anyway)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.proxy.render import TABLE
from tests.fixtures.netns import new_netns

pytestmark = pytest.mark.netns
ROOT = Path(__file__).resolve().parents[2]
ENGINES = ("libnftables", "nft -f -")  # the binary: what runs without the library
ELEMENTS = 60000  # unfixed, listing them cost a context ~55 MiB
BIG = f"""add table ip {TABLE}
add set ip {TABLE} clients-ABCDEFGHIJ {{ type ipv4_addr; }}
add map ip {TABLE} vips {{ type ipv4_addr . inet_proto . inet_service : verdict; }}
add chain ip {TABLE} lb-2
add chain ip {TABLE} other
add table inet pycni-small
add chain inet pycni-small c
add set inet pycni-small s {{ type ipv4_addr; }}
add element inet pycni-small s {{ 10.0.0.1, 10.0.0.2 }}
"""
IN_NETNS = """
import json, sys
from kernel.nft import Nft, table_exists
from services.proxy.sync import ProxySync
from common.metrics import Registry


def peak_kib():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))


case, engine = sys.argv[1:3]
nft = Nft(prefer_library=engine == "libnftables")
before = peak_kib()
if case == "chains":
    sync = ProxySync("node1", None, Registry(), 3600)
    sync.nft = nft
    answer = sorted(sync.calc_chains(4))
else:
    answer = [table_exists(nft, "inet", name) for name in ("pycni-small", "pycni-none")]
    after = nft.list_json("list table inet pycni-small")  # the same context, not terse
    answer.append(sorted(e for o in after["nftables"] if "set" in o for e in o["set"]["elem"]))
print(json.dumps({"answer": answer, "grown_kib": peak_kib() - before}))
"""


@pytest.fixture(scope="module")
def big_netns():
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    ns = new_netns("listing")
    vips = ", ".join(
        f"10.{96 + i // 65536}.{i // 256 % 256}.{i % 256} . tcp . 80 : drop"
        for i in range(ELEMENTS)
    )
    clients = ", ".join(f"10.1.{i // 256 % 256}.{i % 256}" for i in range(ELEMENTS // 2))
    script = (
        BIG
        + f"add element ip {TABLE} vips {{ {vips} }}\n"
        + f"add element ip {TABLE} clients-ABCDEFGHIJ {{ {clients} }}\n"
    )
    ns.run(["nft", "-f", "-"], input=script)
    yield ns
    ns.delete()


def run_case(ns, case: str, engine: str) -> dict:
    out = subprocess.run(
        ["ip", "netns", "exec", ns.name, sys.executable, "-c", IN_NETNS, case, engine],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.mark.parametrize("engine", ENGINES)
def test_table_exists_does_not_read_the_other_tables_elements(big_netns, engine):
    out = run_case(big_netns, "exists", engine)
    assert out["answer"] == [True, False, ["10.0.0.1", "10.0.0.2"]]
    assert out["grown_kib"] < 8 * 1024


@pytest.mark.parametrize("engine", ENGINES)
def test_the_proxys_chain_and_set_names_are_listed_without_their_elements(big_netns, engine):
    out = run_case(big_netns, "chains", engine)
    assert out["answer"] == ["clients-ABCDEFGHIJ", "lb-2"]
    assert out["grown_kib"] < 8 * 1024

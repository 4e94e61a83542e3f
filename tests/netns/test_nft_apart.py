"""``Nft.run_apart`` (the proxy's full renders) in a real netns: a transaction run in a child
``nft -f -`` leaves what the kept context leaves, a refused one is an NftError with nft's
message and applies nothing, and without the binary the kept context runs it; this process's
heap does not take the parse of a large transaction (its peak RSS is the child's, not its own).
``Nft.run_then_elements`` (a full render's declarations, then its element batch, encoded while
the script is applied): the batch lands after the script, whose set it fills, and is not sent
when the script is refused; what the caller gives to run beside the batch's commit runs once,
and not when nothing is committed."""

from __future__ import annotations

import os

import pytest

from tests.fixtures.netns import new_netns, run_json_in

pytestmark = pytest.mark.netns
TABLE = "pycni-apart"
SCRIPT = f"""add table ip {TABLE}
add map ip {TABLE} m {{ type ipv4_addr . inet_service : ipv4_addr . inet_service; }}
add set ip {TABLE} s {{ type ipv4_addr; }}
add element ip {TABLE} s {{ 10.0.0.1, 10.0.0.2 }}
add element ip {TABLE} m {{ 10.96.0.1 . 80 : 10.1.0.1 . 8080 }}
"""
IN_NETNS = """
import json, resource, subprocess, sys
besides = []
spawned, real_run = [], subprocess.run
subprocess.run = lambda argv, **kw: spawned.append(argv[0]) or real_run(argv, **kw)
import kernel.nft as nft_mod
from kernel.nft import Nft, NftError
from kernel.nftelem import ElementBatch, ElementChange, SetType
case, script, listed, before = json.loads(sys.stdin.read())
batch = ElementBatch("ip", "pycni-apart", (
    ElementChange("flush", "s", SetType(("ipv4_addr",)), ()),
    ElementChange("add", "s", SetType(("ipv4_addr",)), (("10.0.0.9", None), ("10.0.0.10", None))),
))


def peak_kib():
    # VmHWM, not ru_maxrss: ru_maxrss survives exec, so it holds the RSS of whatever forked
    # `ip netns exec` (a pytest process hundreds of MiB large after a long run)
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))


if case == "no-binary":
    nft_mod.NFT_BINARY = "pycni-no-such-nft"
nft = Nft()
if before:
    nft.run(before)
try:
    if case == "then":
        nft.run_then_elements(script, lambda: batch, beside=lambda: besides.append(1))
    elif case == "start":  # begun; a transaction asked for before the wait comes after it
        started = nft.start_apart(script)
        nft.run("add element ip pycni-apart s { 10.0.0.7 }")
        started.wait()
    elif case == "start-wait":
        started = nft.start_apart(script)
        besides.append(sum(range(10**5)))  # the caller goes on meanwhile
        started.wait()
    else:
        (nft.run if case == "kept" else nft.run_apart)(script)
    error = None
except NftError as exc:
    error = str(exc)
print(json.dumps({
    "error": error,
    "listing": (
        nft.list_json("list table ip pycni-apart") if listed and (before or not error) else None
    ),
    "self_kib": peak_kib(),
    "child_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    "spawned": spawned,
    "besides": len(besides),
}))
"""


@pytest.fixture
def run_in_netns():
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    made = []

    def run(case: str, script: str, listed: bool = True, before: str = "") -> dict:
        ns = new_netns("apart")
        made.append(ns)
        return run_json_in(ns, IN_NETNS, [case, script, listed, before])

    yield run
    for ns in made:
        ns.delete()


def strip_handles(doc: dict) -> list:
    """The listing without what differs between two netns (handles)."""
    items = []
    for item in doc["nftables"]:
        for kind, body in item.items():
            if kind != "metainfo":
                items.append({kind: {k: v for k, v in body.items() if k != "handle"}})
    return items


def test_a_transaction_run_apart_leaves_what_the_kept_context_leaves(run_in_netns):
    kept, apart = run_in_netns("kept", SCRIPT), run_in_netns("apart", SCRIPT)
    assert kept["error"] is None and apart["error"] is None
    assert strip_handles(apart["listing"]) == strip_handles(kept["listing"])
    assert kept["spawned"] == [] and apart["spawned"] == ["nft"]  # it ran in a child


def test_a_refused_transaction_apart_is_nfts_message_and_applies_nothing(run_in_netns):
    bad = SCRIPT + f"add element ip {TABLE} s {{ 10.0.0.300 }}\n"
    out = run_in_netns("apart", bad)
    assert out["error"] and "10.0.0.300" in out["error"]
    assert out["listing"] is None


FILLER = "".join(f"add set ip {TABLE} pad{i} {{ type ipv4_addr; }}\n" for i in range(1500))


@pytest.mark.parametrize("size", ["small", "large"])
def test_a_transaction_started_apart_comes_before_what_is_asked_after_it(run_in_netns, size):
    """``start_apart`` (a full render's early declarations): a large script's child applies
    it while the caller goes on, and a transaction the caller asks for before waiting is
    applied after it (here it fills the set the script makes); a small one (under 64 KiB)
    is applied at once in the kept context."""
    script = SCRIPT + (FILLER if size == "large" else "")
    kept, started = run_in_netns("kept", SCRIPT), run_in_netns("start", script)
    assert started["error"] is None
    assert started["spawned"] == (["nft"] if size == "large" else [])  # the run: in-process
    assert sorted(set_elements(started["listing"], "s")) == ["10.0.0.1", "10.0.0.2", "10.0.0.7"]
    listed = strip_handles(started["listing"])
    assert [i for i in listed if "map" in i] == [
        i for i in strip_handles(kept["listing"]) if "map" in i
    ]


@pytest.mark.parametrize("size", ["small", "large"])
def test_a_refused_transaction_started_apart_is_raised_by_its_wait(run_in_netns, size):
    """Refused in a child or at once in the kept context, the caller learns it from
    ``wait``, not from ``start_apart`` (its plan goes on; its run answers for it)."""
    bad = SCRIPT + (FILLER if size == "large" else "")
    bad += f"add element ip {TABLE} s {{ 10.0.0.300 }}\n"
    out = run_in_netns("start-wait", bad)
    assert out["error"] and "Error" in out["error"]  # nft's message, from either engine
    assert out["listing"] is None and out["besides"] == 1
    assert out["spawned"] == (["nft"] if size == "large" else [])


def test_without_the_binary_the_kept_context_runs_it(run_in_netns):
    out = run_in_netns("no-binary", SCRIPT)
    assert out["error"] is None and out["spawned"] == []
    assert strip_handles(out["listing"])


def test_a_large_transaction_apart_is_not_this_process_heap(run_in_netns):
    elements = ", ".join(
        f"10.{96 + i // 65536}.{i // 256 % 256}.{i % 256} . 80 : 10.1.{i // 256 % 256}.1 . 8080"
        for i in range(30000)
    )
    big = SCRIPT + f"add element ip {TABLE} m {{ {elements} }}\n"
    kept, apart = run_in_netns("kept", big, False), run_in_netns("apart", big, False)
    assert kept["error"] is None and apart["error"] is None
    grown = kept["self_kib"] - apart["self_kib"]  # what the parse cost the kept context
    assert grown > 20 * 1024 and apart["child_kib"] > grown // 2


def set_elements(doc: dict, name: str) -> list:
    return next(
        i["set"].get("elem", []) for i in doc["nftables"] if i.get("set", {}).get("name") == name
    )


@pytest.mark.parametrize("size", ["small", "large"])
def test_a_batch_after_its_script_fills_what_the_script_made(run_in_netns, size):
    """A small script in the kept context, a large one (64 KiB and more) in a child reading
    it from a memory file: either way the batch is the second transaction (its flush and
    adds replace what the script put in ``s``)."""
    script = SCRIPT + (FILLER if size == "large" else "")
    out = run_in_netns("then", script)
    assert out["error"] is None
    assert out["spawned"] == (["nft"] if size == "large" else [])
    assert sorted(set_elements(out["listing"], "s")) == ["10.0.0.10", "10.0.0.9"]
    assert out["besides"] == 1  # what the caller makes while the kernel takes the batch
    assert len(script) >= 64 * 1024 if size == "large" else len(script) < 64 * 1024


def test_a_refused_script_sends_no_batch(run_in_netns):
    """The table is there first (``s``: 10.0.0.1, 10.0.0.2); a script nft refuses leaves it so,
    and the batch that would have replaced ``s``'s elements is not sent."""
    bad = f"add element ip {TABLE} s {{ 10.0.0.3 }}\nadd element ip {TABLE} nope {{ 10.0.0.4 }}\n"
    out = run_in_netns("then", bad, before=SCRIPT)
    assert out["error"] and "No such file or directory" in out["error"]  # set nope
    assert sorted(set_elements(out["listing"], "s")) == ["10.0.0.1", "10.0.0.2"]
    assert out["besides"] == 0

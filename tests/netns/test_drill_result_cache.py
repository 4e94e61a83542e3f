"""Drill: the runtime's result cache deleted, emptied, corrupted or swapped between ADD and DEL.

A runtime hands a plugin's DEL the result it cached at ADD (``prevResult``); the file can be
gone (a wiped /var/lib/cni), empty or cut short (a full disk, a crash mid-write), garbage, or
another attachment's (a hand-made copy). pycni's DEL must clean up after its own records
whatever it is given, and never touch another Pod's. Real pycnid (SQLite store, NetworkPolicy
enforced, a default-deny policy isolating every Pod), `pycni net` (libcni's cache layout) with
pycni-bridge + pycni-ipam + pycni-svc. After each DEL: nothing of the Pod is left (lease,
endpoint record, host veth, NetworkPolicy elements naming its address, cache file) and every
other Pod keeps its lease, record, veth and its gateway. Prints "N tried, N survived, 0 lost".
"""

from __future__ import annotations

import os
import pathlib

import pytest

from tests.fixtures.doctor import assert_doctor_clean
from tests.fixtures.scale import sized
from tests.fixtures.waiting import wait_for
from tests.netns.drill_node import NETWORK, Drill

pytestmark = [pytest.mark.netns, pytest.mark.long, pytest.mark.drill]

MUTATIONS = ("deleted", "emptied", "truncated", "garbage", "not-an-object", "another-pods")
ROUNDS = sized(1, 5)


def mutate(drill: Drill, name: str, how: str, other: str) -> None:
    path = drill.cache(name)
    data = pathlib.Path(path).read_bytes()
    if how == "deleted":
        os.remove(path)
        return
    changed = {
        "emptied": b"",
        "truncated": data[: len(data) // 2],
        "garbage": os.urandom(64),
        "not-an-object": b"[1, 2, 3]",
        "another-pods": pathlib.Path(drill.cache(other)).read_bytes(),
    }[how]
    with open(path, "wb") as fh:
        fh.write(changed)


def test_del_cleans_up_whatever_the_cache_holds(drill: Drill, netns_factory) -> None:
    tried = survived = 0
    for round_ in range(ROUNDS):
        names = [f"p{round_}-{i}" for i in range(len(MUTATIONS) + 1)]
        for name in names:
            drill.add(name, netns_factory("dpod"))
        wait_for(
            "every Pod isolated",
            lambda names=names: all(f"{drill.pods[n][1]} " in drill.table() for n in names),
            10,
        )
        keeper = names[-1]
        for name, how in zip(names, MUTATIONS, strict=False):
            tried += 1
            gone_ip = drill.pods[name][1]
            mutate(drill, name, how, other=keeper)
            drill.delete(name)
            assert not drill.problems(name), f"cache {how}: {drill.problems(name)}"
            wait_for(
                f"the NetworkPolicy table to forget {gone_ip} (cache {how})",
                lambda gone_ip=gone_ip: not drill.names_address(gone_ip),
                10,
            )
            survived += 1
        keeper_ip = drill.pods[keeper][1]
        drill.delete(keeper)
        assert not os.listdir(os.path.join(drill.runner.cache_dir, "results"))
        wait_for(  # else the doctor below can read the table before the pass this DEL wakes
            f"the NetworkPolicy table to forget the keeper's {keeper_ip}",
            lambda keeper_ip=keeper_ip: not drill.names_address(keeper_ip),
            10,
        )
    print(f"\nresult cache drill: {tried} tried, {survived} survived, {tried - survived} lost")
    assert survived == tried == ROUNDS * len(MUTATIONS)
    config = os.path.join(drill.pycnid.workdir, "pycnid.json")
    doc = assert_doctor_clean(
        drill.node, config, "--cni-conf-dir", drill.runner.conf_dir, networks=()
    )
    assert doc["networks"] == [NETWORK]  # read from the conflist: judged, and clean

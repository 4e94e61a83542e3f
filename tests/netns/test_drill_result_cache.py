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

import json
import os
import pathlib

import pytest

from netpol.policy import parse_policy
from netpol.render import TABLE
from store.base import Put
from store.codec import encode
from store.keys import ENDPOINTS, HANDLES, netpol_key
from store.sqlite import SqliteStore
from tests.fixtures.cnirun import Runner, cache_entry_path, pod_ipv4, write_network
from tests.fixtures.daemon import Pycnid, daemon_config
from tests.fixtures.doctor import assert_doctor_clean
from tests.fixtures.netns import Netns
from tests.fixtures.scale import sized
from tests.fixtures.waiting import wait_for

pytestmark = [pytest.mark.netns, pytest.mark.long, pytest.mark.drill]

NETWORK = "drillnet"
SUBNET = "10.83.0.0/24"
GATEWAY = "10.83.0.1"
MUTATIONS = ("deleted", "emptied", "truncated", "garbage", "not-an-object", "another-pods")
ROUNDS = sized(1, 5)
DENY_ALL = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"namespace": "drill", "name": "deny-all"},
    "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
}


def conflist(socket: str) -> dict:
    return {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [
            {
                "type": "pycni-bridge",
                "bridge": "drillbr0",
                "isGateway": True,
                "ipam": {
                    "type": "pycni-ipam",
                    "daemonSocket": socket,
                    "ranges": [[{"subnet": SUBNET}]],
                },
            },
            {"type": "pycni-svc", "args": {"cni": {"labels": [{"key": "app", "value": "x"}]}}},
        ],
    }  # fmt: skip


class Drill:
    def __init__(self, node: Netns, pycnid: Pycnid, runner: Runner, store: SqliteStore) -> None:
        self.node, self.pycnid, self.runner, self.store = node, pycnid, runner, store
        self.pods: dict[str, tuple[Netns, str]] = {}  # name -> (netns, IPv4)

    def add(self, name: str, ns: Netns) -> None:
        result = self.runner.must("add", NETWORK, ns.path, cni_args=args(name)).json
        self.pods[name] = (ns, pod_ipv4(result))

    def cache(self, name: str) -> str:
        return cache_entry_path(self.runner.cache_dir, NETWORK, self.pods[name][0].path)

    def mutate(self, name: str, how: str, other: str) -> None:
        path = self.cache(name)
        data = pathlib.Path(path).read_bytes()
        if how == "deleted":
            os.remove(path)
            return
        changed = {
            "emptied": b"",
            "truncated": data[: len(data) // 2],
            "garbage": os.urandom(64),
            "not-an-object": b"[1, 2, 3]",
            "another-pods": pathlib.Path(self.cache(other)).read_bytes(),
        }[how]
        with open(path, "wb") as fh:
            fh.write(changed)

    def delete(self, name: str) -> None:
        ns, _ip = self.pods.pop(name)
        self.runner.must("del", NETWORK, ns.path, cni_args=args(name))

    def handles(self) -> set[str]:
        return {kv.key for kv in self.store.range(HANDLES, keys_only=True)}

    def records(self) -> dict[str, str]:
        """Endpoint records: Pod name -> its address."""
        found = {}
        for kv in self.store.range(ENDPOINTS):
            found[kv.key.split("/")[-2]] = json.loads(kv.value)["ips"][0]
        return found

    def table(self) -> str:
        out = self.node.run(["nft", "list", "table", "inet", TABLE], check=False)
        return out.stdout

    def veths(self) -> int:
        out = self.node.run(["ip", "-o", "link", "show", "master", "drillbr0"], check=False)
        return len(out.stdout.splitlines())

    def names_address(self, ip: str) -> bool:
        table = self.table()
        return f"{ip} " in table or f"{ip}," in table

    def problems(self, gone: str) -> list[str]:
        """What DEL left of ``gone`` or took from a live Pod (the kernel's NetworkPolicy
        table follows on its next pass: checked apart)."""
        found = []
        if gone in self.records():
            found.append(f"{gone}'s endpoint record")
        if self.records() != {n: ip for n, (_ns, ip) in self.pods.items()}:
            found.append(f"records {self.records()} != the live Pods")
        if len(self.handles()) != len(self.pods):
            found.append(f"{len(self.handles())} leases for {len(self.pods)} Pods")
        if self.veths() != len(self.pods):
            found.append(f"{self.veths()} veths on the bridge for {len(self.pods)} Pods")
        found += [
            f"{n} lost its gateway" for n, (ns, _) in self.pods.items() if not ns.ping(GATEWAY)
        ]
        return found


def args(name: str) -> str:
    return f"K8S_POD_NAMESPACE=drill;K8S_POD_NAME={name}"


@pytest.fixture
def drill(node, tmp_path, cni_path):
    workdir = str(tmp_path / "pycnid")
    os.makedirs(workdir)
    config = daemon_config(workdir, networkPolicy={"enforce": True})
    pycnid = Pycnid(node=node, workdir=workdir, config=config)
    pycnid.start()
    runner = Runner(
        "pycni",
        node,
        str(tmp_path / "net.d"),
        str(tmp_path / "cache"),
        cni_path,
        extra_env={"PYCNI_SOCKET": pycnid.socket},
    )
    write_network(runner.conf_dir, conflist(pycnid.socket))
    store = SqliteStore(config["store"]["path"])
    policy = parse_policy(DENY_ALL)
    store.txn([], [Put(netpol_key("drill", "deny-all"), encode(policy.to_dict()))])
    try:
        yield Drill(node, pycnid, runner, store)
    finally:
        store.close()
        pycnid.stop()


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
            drill.mutate(name, how, other=keeper)
            drill.delete(name)
            assert not drill.problems(name), f"cache {how}: {drill.problems(name)}"
            wait_for(
                f"the NetworkPolicy table to forget {gone_ip} (cache {how})",
                lambda gone_ip=gone_ip: not drill.names_address(gone_ip),
                10,
            )
            survived += 1
        drill.delete(keeper)
        assert not os.listdir(os.path.join(drill.runner.cache_dir, "results"))
    print(f"\nresult cache drill: {tried} tried, {survived} survived, {tried - survived} lost")
    assert survived == tried == ROUNDS * len(MUTATIONS)
    config = os.path.join(drill.pycnid.workdir, "pycnid.json")
    doc = assert_doctor_clean(
        drill.node, config, "--cni-conf-dir", drill.runner.conf_dir, networks=()
    )
    assert doc["networks"] == [NETWORK]  # read from the conflist: judged, and clean

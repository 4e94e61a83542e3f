"""A node for the fault drills (tests/netns/test_drill_*.py): a real pycnid with NetworkPolicy
enforced and `pycni net` (libcni's cache layout) attaching Pods of namespace ``drill`` through
pycni-bridge + pycni-ipam + pycni-svc; ``problems`` says what a DEL left behind or took from a
live Pod."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

from netpol.policy import parse_policy
from netpol.render import TABLE
from store.base import Put
from store.codec import encode
from store.keys import ENDPOINTS, HANDLES, netpol_key
from store.sqlite import SqliteStore
from tests.fixtures.bridge import node_veths
from tests.fixtures.cnirun import Runner, cache_entry_path, pod_ipv4, write_network
from tests.fixtures.daemon import Pycnid, daemon_config
from tests.fixtures.netns import Netns

NETWORK = "drillnet"
SUBNET = "10.83.0.0/24"
GATEWAY = "10.83.0.1"
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
    """One node: pycnid (SQLite, NetworkPolicy enforced, a deny-all policy isolating every
    Pod of namespace ``drill``) and `pycni net` with pycni-bridge + pycni-ipam + pycni-svc."""

    def __init__(self, node: Netns, pycnid: Pycnid, runner: Runner, store: SqliteStore) -> None:
        self.node, self.pycnid, self.runner, self.store = node, pycnid, runner, store
        self.pods: dict[str, tuple[Netns, str]] = {}  # name -> (netns, IPv4)

    def add(self, name: str, ns: Netns) -> None:
        result = self.runner.must("add", NETWORK, ns.path, cni_args=args(name)).json
        self.pods[name] = (ns, pod_ipv4(result))

    def cache(self, name: str) -> str:
        return cache_entry_path(self.runner.cache_dir, NETWORK, self.pods[name][0].path)

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
        return len(node_veths(self.node, NETWORK))

    def isolated(self) -> set[str]:
        """The addresses the NetworkPolicy table isolates (its ``self4`` set)."""
        out = self.node.run(["nft", "-j", "list", "set", "inet", TABLE, "self4"], check=False)
        if out.returncode != 0:
            return set()
        found = set()
        for obj in json.loads(out.stdout)["nftables"]:
            for element in obj.get("set", {}).get("elem", []):
                found.add(str(element["concat"][0]))
        return found

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


@contextlib.contextmanager
def drill_node(node: Netns, base: str, cni_path: str) -> Iterator[Drill]:
    """The node under ``base`` (the caller removes it), pycnid started; stopped after."""
    workdir = os.path.join(base, "pycnid")
    os.makedirs(workdir)
    config = daemon_config(workdir, networkPolicy={"enforce": True})
    pycnid = Pycnid(node=node, workdir=workdir, config=config)
    pycnid.start()
    runner = Runner(
        "pycni",
        node,
        os.path.join(base, "net.d"),
        os.path.join(base, "cache"),
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

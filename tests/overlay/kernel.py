"""What a node's kernel holds for the overlay, read with iproute2 (not pycni's code), and what
it should hold, worked out from the registry in etcd — so a test judges the sync with readers
of its own: every peer's entries present, nothing else with pycni's marks (nothing stale).

A ``State`` names devices, not indexes, so a device that was recreated compares equal; the
device's index is read apart (``ifindex``) for the tests that say it must not change."""

from __future__ import annotations

import ipaddress
import json
import time
from dataclasses import dataclass

from tests.fixtures.cluster import EtcdOnUnderlay
from tests.fixtures.netns import Netns

VXLAN_DEVICE = "pycni.1"
PROTO = "77"
PREFIX = "/pycni/v1/"


@dataclass(frozen=True)
class State:
    routes: frozenset[tuple[str, str | None, str]]  # (dst, via, dev) with protocol 77
    neighs: frozenset[tuple[str, str]] = frozenset()  # (ip, mac) protocol 77 on the device
    fdbs: frozenset[tuple[str, str]] = frozenset()  # (mac, underlay) on the device

    def without(self, other: State) -> State:
        return State(
            self.routes - other.routes, self.neighs - other.neighs, self.fdbs - other.fdbs
        )

    def naming(self, overlay: dict) -> State:
        """The entries that lead to a node (its VTEP MAC, VTEP addresses or underlay)."""
        to = {overlay["underlay"], *overlay["vteps"]}
        return State(
            frozenset(r for r in self.routes if r[1] in to),
            frozenset(n for n in self.neighs if n[1] == overlay["vtepMAC"] or n[0] in to),
            frozenset(f for f in self.fdbs if f[0] == overlay["vtepMAC"] or f[1] in to),
        )

    def __bool__(self) -> bool:
        return bool(self.routes or self.neighs or self.fdbs)


def ip_json(ns: Netns, cmd: str) -> list[dict]:
    out = ns.run(cmd, check=False)
    return json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else []


def net(dst: str) -> str:
    return str(ipaddress.ip_network(dst, strict=False))


def read_routes(ns: Netns) -> frozenset:
    found = ip_json(ns, f"ip -j -4 route show proto {PROTO}") + ip_json(
        ns, f"ip -j -6 route show proto {PROTO}"
    )
    return frozenset((net(r["dst"]), r.get("gateway"), r["dev"]) for r in found)


def read_state(ns: Netns, device: str = VXLAN_DEVICE) -> State:
    neighs = ip_json(ns, f"ip -j neigh show dev {device}")
    fdbs = ip_json(ns, f"bridge -j fdb show dev {device}")
    return State(
        read_routes(ns),
        frozenset((n["dst"], n["lladdr"]) for n in neighs if str(n.get("protocol")) == PROTO),
        frozenset((f["mac"], f["dst"]) for f in fdbs if "dst" in f),
    )


def ifindex(ns: Netns, device: str = VXLAN_DEVICE) -> int | None:
    found = ip_json(ns, f"ip -j link show dev {device}")
    return found[0]["ifindex"] if found else None


@dataclass(frozen=True)
class Registry:
    """The three prefixes the sync reads, read in one go through etcd's HTTP gateway."""

    nodes: dict[str, dict]  # node -> its record's overlay object
    blocks: dict[str, set[str]]  # node -> its block CIDRs (affinity index)
    hosts: dict[str, set[str]]  # node -> addresses it holds in other nodes' blocks

    @classmethod
    def read(cls, etcd: EtcdOnUnderlay) -> Registry:
        dump = etcd.dump(PREFIX)
        nodes, blocks, hosts = {}, {}, {}
        for key, (value, _) in dump.items():
            parts = key[len(PREFIX) :].split("/")
            if parts[0] == "nodes" and "overlay" in (record := json.loads(value)):
                nodes[parts[1]] = record["overlay"]
            elif parts[0] == "affinity":
                address, _, length = parts[-1].rpartition("-")
                blocks.setdefault(parts[1], set()).add(net(f"{address}/{length}"))
            elif parts[0] == "blocks":
                for ip, holder in json.loads(value).get("borrowed", {}).items():
                    hosts.setdefault(holder, set()).add(net(ip))
        return cls(nodes, blocks, hosts)

    def peer_routes(self, peer: str, via: str, dev: str) -> set:
        return {
            (dst, via, dev) for dst in self.blocks.get(peer, set()) | self.hosts.get(peer, set())
        }

    def expected(
        self,
        me: str,
        bridge: str = "pycni0",
        underlay_dev: str = "eth0",
        unreachable: frozenset[str] = frozenset(),
    ) -> State:
        """What ``me`` should hold: per peer an FDB entry, a neighbour per VTEP and a route per
        block and borrowed address (vxlan), or a route via its underlay (host-gw, unless
        ``unreachable``); its own borrowed addresses routed to its bridge."""
        routes = {(h, None, bridge) for h in self.hosts.get(me, set())}
        neighs, fdbs = set(), set()
        for peer, info in self.nodes.items():
            if peer == me or peer in unreachable:
                continue
            if info["backend"] == "vxlan":
                fdbs.add((info["vtepMAC"], info["underlay"]))
                neighs.update((v, info["vtepMAC"]) for v in info["vteps"])
                routes |= self.peer_routes(peer, info["vteps"][0], VXLAN_DEVICE)
            else:
                routes |= self.peer_routes(peer, info["underlay"], underlay_dev)
        return State(frozenset(routes), frozenset(neighs), frozenset(fdbs))


def calc_mismatch(etcd: EtcdOnUnderlay, nodes: list, **expect: object) -> dict:
    """node -> (missing, unexpected) for every node of ``nodes`` whose kernel differs from what
    the registry says it should hold (empty: every node converged)."""
    registry = Registry.read(etcd)
    out = {}
    for node in nodes:
        want, have = registry.expected(node.name, **expect), read_state(node.host.ns)
        if want != have:
            out[node.name] = (want.without(have), have.without(want))
    return out


#: How long a test waits for the kernel to follow the registry: well inside the 30 s resync,
#: so only the watch (or the netlink monitor) can have done it. How fast it is (the overlay's
#: one second) is a figure of `make bench-overlay` (bench/overlay_converge.py), not a test's
#: bound: CI saw 1.5 s missed on a machine with a load average of 10.
BOUND = 10.0


def wait_converged(
    etcd: EtcdOnUnderlay, nodes: list, timeout: float = BOUND, **expect: object
) -> None:
    """Every node of ``nodes`` holds exactly what the registry says within ``timeout``."""
    deadline = time.monotonic() + timeout
    while (diff := calc_mismatch(etcd, nodes, **expect)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not diff, f"not converged within {timeout:g}s (missing, unexpected): {diff}"

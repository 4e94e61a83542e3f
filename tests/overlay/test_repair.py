"""What the kernel holds survives others and pycnid itself: a pycni route, neighbour, FDB
entry or the VXLAN device deleted by hand is back well before the 30 s resync (the netlink
monitor; ``kernel.BOUND``); a pycnid restart loses at most one reply of a continuous
ping between Pods of two nodes and changes no entry (nothing deleted and re-added, the
device's index kept); at start pycnid removes what carries its marks for nodes that do not
exist, and leaves foreign routes, neighbours and FDB entries alone.

One cluster for the module (two nodes, a Pod on each, metrics on); each test leaves it as it
found it."""

from __future__ import annotations

import re
import select
import signal
import subprocess

import pytest

from tests.fixtures.waiting import wait_for

from .kernel import BOUND, VXLAN_DEVICE, ifindex, ip_json, read_state, wait_converged
from .pods import METRICS, OverlayCluster, Pod, wait_synced

pytestmark = pytest.mark.etcd


@pytest.fixture(scope="module")
def repair(module_overlay) -> OverlayCluster:
    cluster = module_overlay("vxlan", nodes=2, daemon={"metricsAddress": METRICS})
    for node in cluster.nodes:
        cluster.add_pod(node)
    return cluster


@pytest.fixture
def settled(repair) -> OverlayCluster:
    """The cluster converged and its Pods reaching each other, before and after the test."""
    check_settled(repair)
    yield repair
    check_settled(repair)


def check_settled(cluster: OverlayCluster) -> None:
    wait_converged(cluster.cluster.etcd, cluster.nodes, timeout=5)
    src, dst = cluster.pods
    wait_for(f"{src.ip} -> {dst.ip}", lambda: src.ns.ping(dst.ip, timeout=1), 10, 0.2)


def delete_one(ns, kind: str) -> None:
    """Delete one of pycni's entries (or its device) as an operator would; the command must
    succeed (it may be back before anyone could read it again)."""
    state = read_state(ns)
    if kind == "route":
        dst, via, dev = sorted(state.routes)[0]
        ns.run(f"ip route del {dst} via {via} dev {dev} proto 77")
    elif kind == "neighbour":
        ip, _ = sorted(state.neighs)[0]
        ns.run(f"ip neigh del {ip} dev {VXLAN_DEVICE}")
    elif kind == "fdb":
        mac, dst = sorted(state.fdbs)[0]
        ns.run(f"bridge fdb del {mac} dev {VXLAN_DEVICE} dst {dst} self")
    else:
        ns.run(f"ip link del {VXLAN_DEVICE}")


@pytest.mark.parametrize("kind", ["route", "neighbour", "fdb", "device"])
def test_an_entry_or_the_device_deleted_by_hand_is_restored(settled, kind):
    node = settled.nodes[0]
    delete_one(node.host.ns, kind)
    wait_converged(settled.cluster.etcd, settled.nodes, BOUND)
    vteps = {
        a["local"]
        for link in ip_json(node.host.ns, f"ip -j addr show dev {VXLAN_DEVICE}")
        for a in link["addr_info"]
        if a["family"] == "inet"
    }
    assert vteps == set(settled.records()[node.name]["overlay"]["vteps"])


def started(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def start_monitor(ns) -> subprocess.Popen:
    """`ip monitor` of routes, neighbours and links in ``ns``, returned once it prints (a
    probe route is added until it does, then removed)."""
    monitor = started(
        ["ip", "netns", "exec", ns.name, "ip", "-o", "monitor", "route", "neigh", "link"]
    )
    wait_for(
        "ip monitor to listen",
        lambda: (
            ns.run("ip route replace 192.0.2.1/32 dev lo", check=False)
            and select.select([monitor.stdout], [], [], 0.1)[0]
        ),
        timeout=10,
    )
    ns.run("ip route del 192.0.2.1/32 dev lo")
    return monitor


def stop_output(proc: subprocess.Popen, sig: int = signal.SIGINT) -> str:
    proc.send_signal(sig)
    return proc.communicate(timeout=10)[0]


class Ping:
    """A continuous ping, every 0.1 s, that keeps every line it printed (-O: a lost reply
    prints a line too, so reading its output never blocks for long)."""

    def __init__(self, src: Pod, dst: Pod) -> None:
        cmd = ["ip", "netns", "exec", src.ns.name, "ping", "-4", "-O", "-i", "0.1", dst.ip]
        self.proc, self.lines = started(cmd), []

    def replied(self) -> bool:
        """Read one line; whether it is a reply."""
        line = self.proc.stdout.readline()
        self.lines.append(line)
        return "bytes from" in line

    def stop(self) -> str:
        self.lines.extend(stop_output(self.proc).splitlines())
        return "\n".join(self.lines)


def lost_replies(output: str) -> int:
    """Requests with no reply between the first and the last one answered. A request still in
    flight when ping is stopped counts in ping's own summary as lost; it is not lost."""
    answered = {int(seq) for seq in re.findall(r"bytes from .* icmp_seq=(\d+)", output)}
    return max(answered) - min(answered) + 1 - len(answered)


def pinging(src: Pod, dst: Pod) -> Ping:
    """A continuous ping, returned once its first reply came back."""
    ping = Ping(src, dst)
    wait_for("the first reply", ping.replied, 10)
    return ping


def test_a_pycnid_restart_loses_at_most_one_reply_and_changes_no_entry(settled):
    node, (dst, src) = settled.nodes[0], settled.pods  # traffic from node2 to node1's Pod
    before = read_state(node.host.ns), ifindex(node.host.ns)
    monitor, ping = start_monitor(node.host.ns), pinging(src, dst)
    assert node.daemon.stop() == 0
    node.daemon.start()
    wait_synced(node)
    wait_for(
        "ten more replies",
        lambda: all(ping.replied() for _ in range(10)),
        10,
    )
    report, changes = ping.stop(), stop_output(monitor, signal.SIGTERM)
    assert lost_replies(report) <= 1, report
    assert (read_state(node.host.ns), ifindex(node.host.ns)) == before
    deleted = [
        line
        for line in changes.splitlines()
        if line.startswith("Deleted") and (VXLAN_DEVICE in line or "proto 77" in line)
    ]
    assert not deleted, changes


STALE = [
    "ip route add 10.250.7.0/24 via 172.31.250.99 dev eth0 proto 77",
    "ip neigh add 10.250.7.1 lladdr 66:de:ad:00:00:01 dev pycni.1 nud permanent protocol 77",
    "bridge fdb append 66:de:ad:00:00:01 dev pycni.1 dst 172.31.250.99 self permanent",
]
FOREIGN = [
    "ip route add 10.250.8.0/24 via 172.31.250.98 dev eth0 proto static",
    "ip neigh add 10.250.8.1 lladdr 66:f0:0d:00:00:01 dev pycni.1 nud permanent",
    "bridge fdb append 66:f0:0d:00:00:01 dev pycni.1 dst 172.31.250.98 self permanent",
]


def foreign_left(ns) -> list[bool]:
    return [
        "10.250.8.0/24" in ns.run("ip route show proto static").stdout,
        "66:f0:0d:00:00:01" in ns.run(f"ip neigh show dev {VXLAN_DEVICE}").stdout,
        "dst 172.31.250.98" in ns.run(f"bridge fdb show dev {VXLAN_DEVICE}").stdout,
    ]


def test_at_start_entries_for_unknown_nodes_go_and_foreign_ones_stay(settled):
    node = settled.nodes[0]
    ns = node.host.ns
    assert node.daemon.stop() == 0
    for cmd in STALE + FOREIGN:
        ns.run(cmd)
    node.daemon.start()
    wait_synced(node)
    state = read_state(ns)
    assert not {r for r in state.routes if r[0].startswith("10.250.")}, state
    assert not {n for n in state.neighs if n[0].startswith("10.250.")}, state
    assert foreign_left(ns) == [True, True, True]
    assert "66:de:ad:00:00:01" not in ns.run(f"bridge fdb show dev {VXLAN_DEVICE}").stdout
    for cmd in FOREIGN:
        ns.run(cmd.replace(" add ", " del ").replace(" append ", " del "))

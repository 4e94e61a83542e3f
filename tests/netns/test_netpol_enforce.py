"""NetworkPolicy enforced by pycnid's pycni-netpol table, with real packets, against the model.

One node (tests/netns/netpol_cluster.py): x, y, z × a, b, c, dual-stack, on one pycni-bridge,
every Pod serving TCP 80, 81 and UDP 80. For each policy set the full 9 × 9 × 3
reachability matrix (IPv4; the union of all of them on IPv6 too) is probed with real
connects and compared cell by cell with ``netpol.evaluate``: the kernel must say what the
model says. Same-node Pods are bridged, so this also proves that bridged
frames reach the inet forward hook (br_netfilter, checked by pycnid at start). Then: an
established connection survives a policy that would deny it (kept by default), and while
policies change back and forth under traffic, a denied connection never gets through, an
allowed one is never refused and an established flow never stalls (atomic full renders).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest

from netpol.sync import COUNTERS
from tests.fixtures.bridge import bridge_conf, ip_of, new_cid
from tests.fixtures.netns import new_netns
from tests.fixtures.plugins import run_plugin
from tests.fixtures.waiting import wait_for
from tests.netns.netpol_cluster import IPAM, NetpolNode, Pod, make_node, policy, scrape

pytestmark = pytest.mark.netns

DENY_INGRESS_X = policy("x", "deny-ingress")
NS_AND_POD = policy(
    "x",
    "allow-y-b",
    podSelector={"matchLabels": {"pod": "a"}},
    ingress=[
        {
            "from": [
                {
                    "namespaceSelector": {"matchLabels": {"ns": "y"}},
                    "podSelector": {"matchLabels": {"pod": "b"}},
                }
            ]
        }
    ],
)
EGRESS_DENY_Y_C = policy(
    "y", "deny-egress", podSelector={"matchLabels": {"pod": "c"}}, policyTypes=["Egress"]
)
NAMED_PORT = policy(
    "x",
    "named",
    podSelector={"matchLabels": {"pod": "b"}},
    ingress=[{"ports": [{"port": "serve-81-tcp"}, {"port": "serve-80-udp", "protocol": "UDP"}]}],
)
END_PORT = policy(
    "y",
    "end-port",
    podSelector={"matchLabels": {"pod": "a"}},
    ingress=[
        {
            "from": [
                {"namespaceSelector": {"matchExpressions": [
                    {"key": "ns", "operator": "In", "values": ["x", "z"]}
                ]}}
            ],
            "ports": [{"protocol": "TCP", "port": 80, "endPort": 81}],
        }
    ],
)  # fmt: skip


def ip_block_except(node: NetpolNode) -> dict[str, Any]:
    """z/a may reach the pod subnet except x/b (upstream: "egress ... CIDR ... except")."""
    return policy(
        "z",
        "ipblock",
        podSelector={"matchLabels": {"pod": "a"}},
        policyTypes=["Egress"],
        egress=[
            {
                "to": [
                    {"ipBlock": {"cidr": "10.22.0.0/24", "except": [f"{node.pods['x/b'].ip}/32"]}}
                ]
            }
        ],
    )


@pytest.fixture(scope="module")
def npnode(cni_bin: str, cni_path: str) -> Iterator[NetpolNode]:
    made = make_node(cni_bin, cni_path)
    yield made
    made.close()


def test_bridged_frames_reach_the_forward_hook_and_pycnid_says_so(npnode: NetpolNode) -> None:
    metrics = scrape(npnode.node)
    for sysctl in ("bridge-nf-call-iptables", "bridge-nf-call-ip6tables"):
        assert metrics[f'pycni_netpol_bridge_filtering{{sysctl="net.bridge.{sysctl}"}}'] == 1


@pytest.mark.parametrize(
    "name", ["none", "deny-ingress", "ns-and-pod", "egress-deny", "ipblock", "named", "endport"]
)
def test_matrix_matches_the_model(npnode: NetpolNode, name: str) -> None:
    manifests = {
        "none": [],
        "deny-ingress": [DENY_INGRESS_X],
        "ns-and-pod": [DENY_INGRESS_X, NS_AND_POD],
        "egress-deny": [EGRESS_DENY_Y_C],
        "ipblock": [ip_block_except(npnode)],
        "named": [DENY_INGRESS_X, NAMED_PORT],
        "endport": [END_PORT],
    }[name]
    policies = npnode.set_policies(*manifests)
    found = npnode.check_matrix(policies)
    if manifests:
        assert not all(found.values()), "a policy set that denies nothing tests nothing"


def test_all_policies_at_once_are_a_union_on_both_families(npnode: NetpolNode) -> None:
    """The ipBlock is IPv4: over IPv6, z/a's egress allows nothing."""
    policies = npnode.set_policies(
        DENY_INGRESS_X, NS_AND_POD, EGRESS_DENY_Y_C, ip_block_except(npnode), NAMED_PORT, END_PORT
    )
    npnode.check_matrix(policies, families=(4, 6))
    metrics = scrape(npnode.node)
    assert metrics['pycni_netpol_isolated_pods{direction="ingress"}'] == 4  # x/a, x/b, x/c, y/a
    assert metrics['pycni_netpol_isolated_pods{direction="egress"}'] == 2  # y/c, z/a
    count = metrics["pycni_netpol_sync_seconds_count"]
    mean = metrics["pycni_netpol_sync_seconds_sum"] / count
    print(f"netpol sync (render + apply): {mean * 1e3:.1f} ms mean over {count:.0f} renders")


HOLD = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], 80), timeout=2)
print("up", flush=True)
for line in sys.stdin:
    try:
        s.sendall(b"ping"); print(s.recv(4).decode() or "closed", flush=True)
    except OSError as exc:
        print(type(exc).__name__, flush=True)
"""


def test_established_connection_is_kept_when_a_policy_denies_it(npnode: NetpolNode) -> None:
    npnode.set_policies()
    src, dst = npnode.pods["z/c"], npnode.pods["x/a"]
    cmd = ["ip", "netns", "exec", src.ns.name, sys.executable, "-c", HOLD, dst.ip]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as held:
        assert held.stdout is not None and held.stdin is not None
        try:
            assert held.stdout.readline().strip() == "up"
            policies = npnode.set_policies(DENY_INGRESS_X)
            assert npnode.probe(src, [(dst.ip, "TCP", 80)], 1.0) == [False]  # new: denied
            held.stdin.write("\n")
            held.stdin.flush()
            assert held.stdout.readline().strip() == "ping"  # established: kept
            npnode.check_matrix(policies)
        finally:
            held.kill()
    dropped = npnode.node.run(
        ["nft", "-j", "list", "counter", "inet", "pycni-netpol", "dropped-in/x/a"]
    )
    packets = json.loads(dropped.stdout)["nftables"][1]["counter"]["packets"]
    assert packets > 0
    # pycnid reads the counters (one netlink dump) within COUNTERS_AFTER of the pass that
    # changed the table, and every COUNTERS seconds: its metric counts at least those drops
    wait_for(
        "pycni_netpol_dropped_packets{ingress} >= the counter's packets",
        lambda: (
            scrape(npnode.node).get('pycni_netpol_dropped_packets{direction="ingress"}', 0)
            >= packets
        ),
        COUNTERS + 5,
    )


FLOW = """
import json, socket, sys, time
dst, seconds = sys.argv[1], float(sys.argv[2])
s = socket.create_connection((dst, 80), timeout=2); s.settimeout(1.0)
ok = bad = 0; worst = 0.0; end = time.monotonic() + seconds
while time.monotonic() < end:
    t = time.monotonic()
    try:
        s.sendall(b"p"); ok += s.recv(1) == b"p"
    except OSError:
        bad += 1
    worst = max(worst, time.monotonic() - t); time.sleep(0.002)
print(json.dumps({"ok": ok, "bad": bad, "worst": worst}))
"""
CONNECTS = """
import json, socket, sys, time
dst, seconds, timeout = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
made = failed = 0; end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        socket.create_connection((dst, 80), timeout=timeout).close(); made += 1
    except OSError:
        failed += 1
print(json.dumps({"made": made, "failed": failed}))
"""


def test_policy_changes_under_traffic_open_no_window(npnode: NetpolNode) -> None:
    """Two policy sets, swapped while traffic runs: both deny z/a → x/a and allow y/b → x/a;
    each swap renames the shape chain (its policies changed), so every swap rewrites the
    table's rules and sets in one transaction."""
    extra = policy(
        "x",
        "extra",
        podSelector={"matchLabels": {"pod": "a"}},
        ingress=[
            {"from": [{"podSelector": {"matchLabels": {"pod": "c"}}}], "ports": [{"port": 81}]}
        ],
    )
    first, second = (DENY_INGRESS_X, NS_AND_POD), (DENY_INGRESS_X, NS_AND_POD, extra)
    npnode.set_policies(*first)
    dst = npnode.pods["x/a"].ip
    seconds = 6.0
    runs = {
        "flow": (npnode.pods["y/b"], FLOW, [dst, str(seconds)]),
        "allowed": (npnode.pods["y/b"], CONNECTS, [dst, str(seconds), "2.0"]),
        "denied": (npnode.pods["z/a"], CONNECTS, [dst, str(seconds), "0.2"]),
    }
    results: dict[str, dict] = {}

    def run(key: str) -> None:
        pod, script, args = runs[key]
        cmd = ["ip", "netns", "exec", pod.ns.name, sys.executable, "-c", script, *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30)
        results[key] = json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr}

    threads = [threading.Thread(target=run, args=(k,)) for k in runs]
    for t in threads:
        t.start()
    swaps, started = 0, time.monotonic()
    while time.monotonic() - started < seconds - 1.0:
        npnode.set_policies(*(second if swaps % 2 == 0 else first))
        swaps += 1
    for t in threads:
        t.join()
    assert swaps >= 5, f"only {swaps} policy swaps in {seconds}s"
    assert results["denied"]["made"] == 0 and results["denied"]["failed"] > 0, results
    assert results["allowed"]["failed"] == 0 and results["allowed"]["made"] > 0, results
    assert results["flow"]["bad"] == 0 and results["flow"]["ok"] > 100, results
    print(f"policy swaps under traffic: {swaps}; results {results}")


@contextmanager
def attached(npnode: NetpolNode, name: str) -> Iterator[tuple[str, float]]:
    """Pod ``x/<name>`` added as a conflist does (pycni-bridge, then pycni-svc with its
    labels); yields its IPv4 address and how long pycni-svc's ADD took, then DELs it."""
    pod, cid = new_netns("nppod"), new_cid()
    common: dict[str, Any] = {
        "container_id": cid,
        "cni_path": npnode.cni_path,
        "socket": npnode.pycnid.socket,
        "netns": pod.path,
        "args": f"K8S_POD_NAMESPACE=x;K8S_POD_NAME={name}",
    }
    bridge = bridge_conf(IPAM, isDefaultGateway=True)
    try:
        added = run_plugin(npnode.exe("pycni-bridge"), "ADD", bridge, **common)
        assert added.code == 0, added.stderr
        svc_conf = {
            "cniVersion": "1.0.0",
            "name": "podnet",
            "type": "pycni-svc",
            "args": {"cni": {"labels": [{"key": "pod", "value": name}]}},
            "prevResult": added.json,
        }
        started = time.monotonic()
        svc = run_plugin(npnode.exe("pycni-svc"), "ADD", svc_conf, **common)
        took = time.monotonic() - started
        assert svc.code == 0, svc.stdout
        yield ip_of(added.json), took
        for plugin, conf in (("pycni-svc", svc_conf), ("pycni-bridge", bridge)):
            assert run_plugin(npnode.exe(plugin), "DEL", conf, **common).code == 0
    finally:
        pod.delete()


def ingress_entries(npnode: NetpolNode) -> str:
    listed = npnode.node.run(["nft", "-j", "list", "map", "inet", "pycni-netpol", "ingress4"])
    return json.dumps(json.loads(listed.stdout)["nftables"][1]["map"].get("elem", []))


@pytest.mark.parametrize("name", ["d", "e"])
def test_a_new_pod_is_isolated_before_its_add_returns(npnode: NetpolNode, name: str) -> None:
    """When pycni-svc's ADD returns, the kernel already sends the new Pod's traffic to its
    policies' chain; x/a already has those policies, so the ADD adds the Pod's map entries
    at once instead of waiting for a pass (``netpol/isolate.py``, counted in
    ``pycni_netpol_settled_at_once_total``)."""
    npnode.set_policies(DENY_INGRESS_X)
    at_once = scrape(npnode.node).get("pycni_netpol_settled_at_once_total", 0)
    with attached(npnode, name) as (ip, took):
        assert ip in ingress_entries(npnode)
        assert scrape(npnode.node)["pycni_netpol_settled_at_once_total"] == at_once + 1
        print(f"pycni-svc ADD with the Pod programmed: {took * 1e3:.0f} ms")


def test_pods_added_together_are_each_isolated_when_their_add_returns(
    npnode: NetpolNode,
) -> None:
    """Six ADDs at once: passes run between and during them (each ADD's record wakes one), so
    some pass reads its inputs before a Pod that an ADD then isolated at once; that pass must
    keep the Pod's entries (pins), and every ADD finds its Pod in the map when it returns."""
    npnode.set_policies(DENY_INGRESS_X)
    missing: list[str] = []

    def add(name: str) -> None:
        with attached(npnode, name) as (ip, _took):
            if ip not in ingress_entries(npnode):
                missing.append(f"x/{name} {ip}")
            time.sleep(0.3)  # held while the others come and go: passes run meanwhile
            if ip not in ingress_entries(npnode):
                missing.append(f"x/{name} {ip} (later)")

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(add, [f"t{i}" for i in range(6)]))  # an ADD's failure raises here
    assert not missing, missing


def test_existing_connections_are_purged_on_request(npnode: NetpolNode) -> None:
    """``existingConnections: purge``: the connection a new policy denies is cut (its
    conntrack entry deleted: its next packet meets the policy), one it allows is kept."""
    npnode.set_policies()
    npnode.restart(existingConnections="purge")
    try:
        denied, allowed = npnode.pods["z/c"], npnode.pods["y/b"]
        dst = npnode.pods["x/a"]
        with hold(denied, dst.ip) as cut, hold(allowed, dst.ip) as kept:
            npnode.set_policies(DENY_INGRESS_X, NS_AND_POD)
            try:
                wait_for("the purge", lambda: purged(npnode) >= 1, 10)
            except AssertionError:
                raise AssertionError(npnode.pycnid.log()[-4000:]) from None
            assert ping(cut) == "TimeoutError"
            assert ping(kept) == "ping"
    finally:
        npnode.restart()


def purged(node: NetpolNode) -> float:
    return scrape(node.node).get("pycni_netpol_conntrack_purged_total", 0)


@contextmanager
def hold(pod: Pod, ip: str) -> Iterator[subprocess.Popen]:
    cmd = ["ip", "netns", "exec", pod.ns.name, sys.executable, "-c", HOLD, ip]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
            yield proc
        finally:
            proc.kill()


def ping(proc: subprocess.Popen) -> str:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()

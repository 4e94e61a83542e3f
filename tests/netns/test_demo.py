"""`make demo` end to end: it must succeed, show both pods reaching each other and the gateway,
then a Pod on each of two nodes reaching the other over VXLAN, then a Service over those two
Pods (added through pycni-bridge + pycni-svc) answering from both through its VIP and traced,
and leave nothing behind (namespaces, pycnids, etcd, the Pods' servers, temp dir) — and clean
up just as well when a step fails half-way."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

pytestmark = [pytest.mark.netns, pytest.mark.etcd, pytest.mark.slow]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _root_only():
    if os.geteuid() != 0:
        pytest.skip("the demo creates network namespaces: needs root")


def run_demo(env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", f"{REPO}/scripts/demo.sh"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def leftovers(output: str) -> list[str]:
    """Namespaces, temp dir and processes of the demo run that printed `output`."""
    tag = re.search(r"node: (pycnidemo\d+)-node", output)
    work = re.search(r"to (/tmp/pycni-demo\.\w+)", output)
    found = []
    if tag:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        found += [ln.split()[0] for ln in names.splitlines() if ln.startswith(tag.group(1))]
        procs = subprocess.run(["pgrep", "-f", tag.group(1)], capture_output=True, text=True)
        found += [f"pid {pid}" for pid in procs.stdout.split()]  # the Pods' servers, too
    if work:
        if os.path.exists(work.group(1)):
            found.append(work.group(1))
        procs = subprocess.run(["pgrep", "-f", work.group(1)], capture_output=True, text=True)
        found += [f"pid {pid}" for pid in procs.stdout.split()]
    return found


def test_demo_wires_two_pods_then_two_nodes_and_cleans_up():
    proc = run_demo()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "pycni demo: OK" in out
    # one node: pod1<->pod2, each pod -> gateway; two nodes: each way across
    assert out.count(", 0% packet loss") == 6, out
    assert re.search(r"pod1: eth0\S* 10\.85\.0\.\d+/24", out), out
    assert "veth pairs left on the node: 0" in out
    assert re.search(
        r"pod on node2 -> pod on node1 10\.244\.\S+ +3 packets transmitted, "
        r"3 received",
        out,
    ), out
    assert re.search(r"via 10\.244\.\S+ dev pycni\.1 onlink", out), out  # node1's route
    assert re.search(r"dst 172\.31\.251\.12 self permanent", out), out  # node1's FDB entry
    assert "veth pairs left on the nodes: 0" in out
    assert_service_shown(out)
    assert leftovers(out) == []


def assert_service_shown(out: str) -> None:
    """demo/web over both Pods: listed as its endpoints, every connect to the VIP answered,
    by both Pods (one is the client itself: hairpin), traced, then removed."""
    vip = re.search(r"--selector app=web: clusterIP (10\.96\.0\.\d+)", out)
    assert vip, out
    for node in ("node1", "node2"):
        assert re.search(rf"demo/web-{node} +eth0 +10\.244\.\S+ +{node} +http=8080", out), out
    connects = int(re.search(r"(\d+) connects from the pod on node1 to ", out).group(1))
    counts = [
        int(n) for n in re.findall(r"answered by the pod on node[12] 10\.244\.\S+ +(\d+)", out)
    ]
    assert len(counts) == 2 and sum(counts) == connects and min(counts) > 0, out
    assert "ClusterIP demo/web:http: dnat" in out, out
    assert "masquerade: hairpin: the client is this endpoint" in out, out
    assert f"removed demo/web; freed {vip.group(1)}" in out, out


def interrupted_demo(when, sig: int) -> tuple[int, str]:
    """Run the demo and send it ``sig`` at the first output line ``when`` accepts; its exit
    code and whole output. SIGINT goes to the demo's whole process group, as a terminal's
    Ctrl-C does: bash, waiting on a foreground command, acts on a SIGINT only when that
    command got it too (it would otherwise take the command for handling it, and go on)."""
    lines = []
    with subprocess.Popen(
        ["bash", f"{REPO}/scripts/demo.sh"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if when(line):
                if sig == signal.SIGINT:
                    os.killpg(proc.pid, sig)
                else:
                    proc.send_signal(sig)
        proc.wait(timeout=60)
    return proc.returncode, "".join(lines)


def test_demo_cleans_up_when_interrupted():
    """Ctrl-C once pycnid is serving: the trap stops pycnid and removes everything."""
    code, out = interrupted_demo(
        lambda line: "pycnid pid" in line and "serving" in line, signal.SIGINT
    )
    # Ctrl-C reaches the foreground `pycni net add` and pycnid too; when the ADD is past its
    # start, it ends with the plugin's code 11 (pycnid stopped mid-request: "sent no reply",
    # or "closed the connection" when the request was still being sent) instead of dying of
    # the signal, and errexit then ends the script (1) before bash runs its INT trap (130)
    ended_mid_add = "failed (ADD)" in out and "CNI error 11 (try again later): pycnid" in out
    assert code == 130 or (code == 1 and ended_mid_add), out
    assert "pycnid stopped" in out and "pycni demo: FAILED" in out
    time.sleep(0.2)
    assert leftovers(out) == []


def test_demo_cleans_up_when_interrupted_on_two_nodes():
    """SIGTERM while the Service's servers run in both Pods of the two-node part: the servers
    are stopped, the Pods DELeted through the conflist (pycni-svc too, from their CNI_ARGS),
    both pycnids and etcd stopped, and everything removed."""
    code, out = interrupted_demo(
        lambda line: "connects from the pod on node1" in line, signal.SIGTERM
    )
    assert code == 143, out
    assert "node1-pod: DEL ok" in out and "node2-pod: DEL ok" in out, out
    for daemon in (
        "web server on node1",
        "web server on node2",
        "pycnid on node1",
        "pycnid on node2",
        "etcd",
    ):
        assert f"{daemon} stopped" in out, out
    time.sleep(0.2)
    assert leftovers(out) == []

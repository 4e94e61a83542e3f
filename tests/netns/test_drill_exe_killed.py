"""Drill: the plugin executable killed mid-request, as a runtime does when its timeout fires.

pycni-bridge (with pycni-ipam, both served by one real pycnid) is SIGKILLed at a random point
of its ADD: before it reached pycnid, while pycnid works, or after pycnid answered. The
runtime then sends DEL for the same attachment, as libcni does for an ADD that did not return
a result. Whatever point the kill hit, after the DEL nothing of the attachment is left (veth,
lease, address in the Pod), pycnid keeps serving, and a Pod added before keeps its gateway.
Prints "N tried, N survived, 0 lost".
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time

import pytest

from store.keys import HANDLES
from store.sqlite import SqliteStore
from tests.fixtures.bridge import NETWORK, bridge_conf, new_cid, node_veths
from tests.fixtures.plugins import run_plugin
from tests.fixtures.scale import sized

pytestmark = [pytest.mark.netns, pytest.mark.long, pytest.mark.drill]

KILLS = sized(12, 100)
IPAM = {"type": "pycni-ipam", "ranges": [[{"subnet": "10.85.0.0/24"}]]}
CONF = bridge_conf(IPAM, bridge="killbr0")
GATEWAY = "10.85.0.1"


def plugin_env(cid: str, netns: str, command: str, socket: str, cni_path: str) -> dict:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": cni_path,
        "PYCNI_SOCKET": socket,
    }


def add_killed_after(exe: str, env: dict, delay: float) -> int | None:
    """Start the ADD, SIGKILL it after ``delay`` s; its exit code if it finished first."""
    proc = subprocess.Popen(
        [exe], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(CONF).encode())
    proc.stdin.close()
    time.sleep(delay)
    finished = proc.poll()
    if finished is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    return finished


def test_del_after_a_killed_add_leaves_nothing(node, pycnid, cni_bin, cni_path, netns_factory):
    exe = os.path.join(cni_bin, "pycni-bridge")
    store = SqliteStore(pycnid.config["store"]["path"])
    rnd = random.Random(KILLS)

    def run(command: str, cid: str, netns: str):
        return run_plugin(
            exe, command, CONF, container_id=cid, netns=netns, cni_path=cni_path,
            socket=pycnid.socket,
        )  # fmt: skip

    def veths() -> int:
        return len(node_veths(node, NETWORK))

    keeper = netns_factory("kpod")
    assert run("ADD", new_cid(), keeper.path).code == 0
    tried = survived = finished = 0
    try:
        for _ in range(KILLS):
            tried += 1
            pod, cid = netns_factory("kpod"), new_cid()
            env = plugin_env(cid, pod.path, "ADD", pycnid.socket, cni_path)
            finished += add_killed_after(exe, env, rnd.uniform(0.0, 0.25)) is not None
            deleted = run("DEL", cid, pod.path)
            assert deleted.code == 0, f"DEL after a killed ADD: {deleted.stdout}"
            left = len(store.range(HANDLES, keys_only=True))
            assert (left, veths()) == (1, 1), f"after DEL: {left} leases, {veths()} veths"
            assert "eth0" not in pod.links(), "the killed ADD's interface outlived its DEL"
            assert keeper.ping(GATEWAY), "a Pod added before lost its gateway"
            survived += 1
    finally:
        store.close()
    assert run("ADD", new_cid(), netns_factory("kpod").path).code == 0, "pycnid stopped serving"
    print(
        f"\nexecutable killed drill: {tried} tried ({finished} had finished, "
        f"{tried - finished} killed mid-request), {survived} survived, 0 lost"
    )
    assert survived == tried

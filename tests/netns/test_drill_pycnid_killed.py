"""Drill: pycnid SIGKILLed in the middle of an ADD or a DEL, at every step of the path, then
restarted.

A node with NetworkPolicy enforced attaches Pods through pycni-bridge + pycni-ipam +
pycni-svc (`pycni net`, libcni's cache layout). For each step an ADD passes (the bridge's
steps, the IPAM's allocation and result, pycni-svc's publish: ``Faults`` points), pycnid kills
itself there (`PYCNI_FAULT=kill@<step>`, fault injection is on in tests); the ADD fails, pycnid
is started again, and the runtime's DEL for the failed ADD must leave nothing: no lease, veth,
endpoint record, NetworkPolicy element. A Pod added before keeps its lease, record and
gateway through every crash, and `pycni doctor` finds the node clean at the end. A DEL killed
at each of its steps (pycni-svc's withdrawal, the bridge's masquerade elements and veth, the
lease's release) fails, and the runtime's repeated DEL must leave the same nothing. The same
for pycni-ipam under the reference bridge (/usr/lib/cni/bridge), killed at each of the IPAM's
steps of an ADD and of a DEL. `make test` kills at a third of the steps, `make drills` at all.
Prints "N tried, N survived, 0 lost".
"""

from __future__ import annotations

import os

import pytest

from plugins.bridge.add import ADD_STEPS
from tests.fixtures.doctor import assert_doctor_clean
from tests.fixtures.ipam import handles, run_reference
from tests.fixtures.netns import Netns
from tests.fixtures.scale import sized
from tests.fixtures.waiting import wait_for
from tests.netns.drill_node import NETWORK, Drill, args

pytestmark = [pytest.mark.netns, pytest.mark.long, pytest.mark.drill]

ALL_STEPS = (*ADD_STEPS, "ipam-allocate", "ipam-result", "svc-publish")
STEPS = sized(("ipam-allocate", "setup-masquerade", "settle-netpol", "svc-publish"), ALL_STEPS)
#: a DEL's points, in the order a conflist's DEL passes them (pycni-svc's first)
ALL_DEL_STEPS = (
    "svc-withdraw",
    "del-masquerade",
    "del-ipam",
    "ipam-release",
    "ipam-released",
    "del-finish",
)
DEL_STEPS = sized(("svc-withdraw", "del-ipam", "ipam-released"), ALL_DEL_STEPS)


def assert_recovers(drill: Drill, pod: Netns, name: str, command: str, step: str) -> None:
    """Pod ``name``'s ``command`` (add | del) with pycnid killed at ``step``: it fails, pycnid
    is started again, and the runtime's DEL leaves nothing of the Pod (the kernel's
    NetworkPolicy table included) and takes nothing from the live ones."""
    cni_args = f"{args(name)};PYCNI_FAULT=kill@{step}"
    failed = drill.runner.run(command, NETWORK, pod.path, cni_args=cni_args)
    assert not failed.ok, f"the {command.upper()} killed at {step} succeeded"
    assert drill.pycnid.proc is not None and drill.pycnid.proc.wait(10) == -9, step
    drill.pycnid.start()
    drill.runner.must("del", NETWORK, pod.path, cni_args=args(name))
    assert not drill.problems(name), f"killed at {step}: {drill.problems(name)}"
    assert "eth0" not in pod.links(), f"killed at {step}: the Pod kept an interface"
    live = {ip for _ns, ip in drill.pods.values()}
    wait_for(
        f"the NetworkPolicy table to hold the live Pods only (killed at {step})",
        lambda: drill.isolated() == live,
        10,
    )


def test_a_pycnid_killed_mid_add_leaves_nothing_after_restart_and_del(
    drill: Drill, netns_factory
) -> None:
    drill.add("keeper", netns_factory("dpod"))
    tried = survived = 0
    for i, step in enumerate(STEPS):
        tried += 1
        pod, name = netns_factory("dpod"), f"k{i}"
        assert_recovers(drill, pod, name, "add", step)
        survived += 1
    print(f"\npycnid killed mid-ADD drill: {tried} tried, {survived} survived, 0 lost")
    assert survived == tried
    config = os.path.join(drill.pycnid.workdir, "pycnid.json")
    doc = assert_doctor_clean(
        drill.node, config, "--cni-conf-dir", drill.runner.conf_dir, networks=()
    )
    assert doc["networks"] == [NETWORK]  # read from the conflist: judged, and clean


def test_a_pycnid_killed_mid_del_leaves_nothing_after_restart_and_a_repeated_del(
    drill: Drill, netns_factory
) -> None:
    drill.add("keeper", netns_factory("dpod"))
    tried = survived = 0
    for i, step in enumerate(DEL_STEPS):
        tried += 1
        pod, name = netns_factory("dpod"), f"d{i}"
        drill.add(name, pod)
        drill.pods.pop(name)  # gone for the runtime: its DEL is under way
        assert_recovers(drill, pod, name, "del", step)
        survived += 1
    print(f"\npycnid killed mid-DEL drill: {tried} tried, {survived} survived, 0 lost")
    assert survived == tried


REFERENCE_STEPS = sized(
    ("ipam-allocate", "ipam-released"),
    ("ipam-allocate", "ipam-result", "ipam-release", "ipam-released"),
)
REFERENCE_BRIDGE = {
    "cniVersion": "1.0.0",
    "name": "refkill",
    "type": "bridge",
    "bridge": "refkill0",
    "isGateway": True,
    "ipMasq": False,
    "ipam": {"type": "pycni-ipam", "ranges": [[{"subnet": "10.69.0.0/24"}]]},
}


def test_a_pycnid_killed_under_the_reference_bridge_leaves_no_lease(
    node, pycnid, netns_factory, cni_bin
) -> None:
    """The reference bridge delegating to pycni-ipam: pycnid killed at an IPAM step of an ADD
    (the ADD fails) or of a DEL (the DEL fails), restarted; the runtime's DEL (again) leaves
    no lease and no interface in the Pod; a Pod added before keeps its lease and gateway."""

    def run(command: str, pod, cid: str, fault: str = ""):
        extra = f";PYCNI_FAULT=kill@{fault}" if fault else ""
        return run_reference(node, "bridge", command, REFERENCE_BRIDGE, cni_bin=cni_bin,
                             socket=pycnid.socket, cid=cid, netns=pod.path,
                             args=f"IgnoreUnknown=1{extra}")  # fmt: skip

    keeper = netns_factory("dpod")
    assert run("ADD", keeper, "keeper").ok
    tried = survived = 0
    for i, step in enumerate(REFERENCE_STEPS):
        tried += 1
        pod, cid = netns_factory("dpod"), f"ref{i}"
        if step.startswith("ipam-release"):  # a DEL killed: the Pod was added first
            assert run("ADD", pod, cid).ok
        failed = run("DEL" if step.startswith("ipam-release") else "ADD", pod, cid, step)
        assert not failed.ok, f"the call killed at {step} succeeded"
        assert pycnid.proc is not None and pycnid.proc.wait(10) == -9, step
        pycnid.start()
        deleted = run("DEL", pod, cid)
        assert deleted.ok, f"killed at {step}: {deleted.stdout}"
        assert [h.handle.container_id for h in handles(pycnid)] == ["keeper"], step
        assert "eth0" not in pod.links(), f"killed at {step}: the Pod kept an interface"
        assert keeper.ping("10.69.0.1"), f"killed at {step}: the keeper lost its gateway"
        survived += 1
    print(
        f"\npycnid killed under the reference bridge: {tried} tried, {survived} survived, 0 lost"
    )
    assert survived == tried

"""ADD is all-or-nothing: a fault injected before each step in turn leaves zero residue."""

from __future__ import annotations

import pytest

from plugins.bridge.plugin import ADD_STEPS
from tests.fixtures.bridge import (
    GATEWAY,
    bridge_conf,
    container_links,  # noqa: F401
    new_cid,
    pycni_ipam,
)

pytestmark = pytest.mark.netns


def test_every_step_has_a_fault_point():
    assert ADD_STEPS[0] == "ensure-bridge" and ADD_STEPS[-1] == "finish"
    assert {"ipam-add", "setup-veth", "setup-pod", "setup-masquerade"} <= set(ADD_STEPS)


def test_a_fault_at_every_step_leaves_nothing_behind(bridge_node, netns_factory, doctor_clean):
    conf = bridge_conf(pycni_ipam(), hairpinMode=True, isDefaultGateway=True, mtu=1400)
    pod = netns_factory("pod")
    cid = new_cid()
    for step in ADD_STEPS:
        res = bridge_node.run("ADD", conf, cid, pod.path, args=f"PYCNI_FAULT={step}")
        assert res.code != 0, f"ADD with a fault at {step} succeeded"
        assert f"injected fault at step '{step}'" in res.json["msg"]
        assert bridge_node.residue().is_empty(), (step, bridge_node.residue())
        assert "eth0" not in container_links(pod), step
    # and the same attachment then comes up cleanly
    _, result = bridge_node.add(conf, pod, container_id=cid)
    assert pod.ping(GATEWAY)
    check = bridge_node.run("CHECK", {**conf, "prevResult": result}, cid, pod.path)
    assert check.code == 0, check.stdout


def test_a_failing_ipam_leaves_nothing_behind(bridge_node, netns_factory):
    pod = netns_factory("pod")
    conf = bridge_conf(pycni_ipam("10.22.0.0/30"))  # room for one pod (gateway .1, pod .2)
    bridge_node.add(conf, pod)
    before = bridge_node.residue()
    full = bridge_node.run("ADD", conf, new_cid(), netns_factory("pod").path)
    assert full.code != 0
    assert bridge_node.residue() == before

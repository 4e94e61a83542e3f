"""pycni-bridge DEL and GC leave zero residue, whatever the runtime got wrong
(DEL twice, with no netns or a deleted one, with a missing, garbage or stale prevResult; a
pycnid killed mid-ADD): runtimes do all of these, and whatever DEL leaves stays for good."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.bridge import (
    GATEWAY,
    bridge_conf,
    container_links,  # noqa: F401
    new_cid,
    pycni_ipam,
)

pytestmark = pytest.mark.netns

DEL_CASES = [
    "twice",
    "empty-netns",
    "deleted-netns",
    "no-prevresult",
    "garbage-prevresult",
    "stale-prevresult",
]


@pytest.mark.parametrize("case", DEL_CASES)
def test_del_leaves_zero_residue(bridge_node, netns_factory, case):
    pod = netns_factory("pod")
    conf = bridge_conf(pycni_ipam())
    cid, result = bridge_node.add(conf, pod)
    assert not bridge_node.residue().is_empty()
    netns = pod.path
    del_conf = {**conf, "prevResult": result}
    if case == "empty-netns":
        netns = ""
    elif case == "deleted-netns":
        pod.delete()
    elif case == "no-prevresult":
        del_conf = conf
    elif case == "garbage-prevresult":
        del_conf = {**conf, "prevResult": "not a result"}
    elif case == "stale-prevresult":  # points at an address this pod never had
        del_conf = {**conf, "prevResult": {**result, "ips": [{"address": "10.22.0.200/24"}]}}
    first = bridge_node.run("DEL", del_conf, cid, netns)
    assert first.code == 0, first.stdout
    if case == "twice":
        assert bridge_node.run("DEL", del_conf, cid, netns).code == 0
    assert bridge_node.residue().is_empty(), bridge_node.residue()


def test_del_of_a_never_added_container_succeeds(bridge_node, netns_factory):
    pod = netns_factory("pod")
    res = bridge_node.run("DEL", bridge_conf(pycni_ipam()), new_cid(), pod.path)
    assert res.code == 0 and res.stdout == ""
    assert bridge_node.residue().is_empty()


def test_del_touches_only_its_own_attachment(bridge_node, netns_factory):
    conf = bridge_conf(pycni_ipam())
    pod_a, pod_b = netns_factory("pod"), netns_factory("pod")
    cid_a, _ = bridge_node.add(conf, pod_a)
    cid_b, res_b = bridge_node.add(conf, pod_b)
    assert bridge_node.run("DEL", conf, cid_a, "").code == 0
    left = bridge_node.residue()
    assert left.veths == [res_b["interfaces"][1]["name"]]
    assert len(left.elements) == 2 and all(cid_b in e for e in left.elements)
    assert [h.rsplit("/", 2)[1] for h in left.leases] == [cid_b]
    assert pod_b.ping(GATEWAY)


def gc_conf(valid: list[tuple[str, str]] | None) -> dict:
    conf = bridge_conf(pycni_ipam())
    if valid is not None:
        conf["cni.dev/valid-attachments"] = [{"containerID": c, "ifname": i} for c, i in valid]
    return conf


def test_gc_removes_what_is_not_valid_and_keeps_the_rest(bridge_node, netns_factory, doctor_clean):
    conf = bridge_conf(pycni_ipam())
    pods = [netns_factory("pod") for _ in range(3)]
    added = [bridge_node.add(conf, pod) for pod in pods]
    keep_cid, keep_result = added[0]
    res = bridge_node.run("GC", gc_conf([(keep_cid, "eth0")]), "")
    assert res.code == 0, res.stdout
    left = bridge_node.residue()
    assert left.veths == [keep_result["interfaces"][1]["name"]]
    assert len(left.elements) == 2 and all(keep_cid in e for e in left.elements)
    assert len(left.leases) == 1 and keep_cid in left.leases[0]
    assert "eth0" not in container_links(pods[1])
    assert pods[0].ping(GATEWAY)
    check = bridge_node.run("CHECK", {**conf, "prevResult": keep_result}, keep_cid, pods[0].path)
    assert check.code == 0, check.stdout


def test_gc_without_the_key_removes_everything_of_this_network_only(bridge_node, netns_factory):
    ours, theirs = netns_factory("pod"), netns_factory("pod")
    bridge_node.add(bridge_conf(pycni_ipam()), ours)
    other = bridge_conf(pycni_ipam("10.23.0.0/24"), name="othernet", bridge="pycni1")
    _, other_result = bridge_node.add(other, theirs)
    assert bridge_node.run("GC", gc_conf(None), "").code == 0
    assert bridge_node.residue().is_empty()
    left = bridge_node.residue("othernet")
    assert left.veths == [other_result["interfaces"][1]["name"]]
    assert len(left.elements) == 2 and len(left.leases) == 1
    assert theirs.ping("10.23.0.1")


def test_gc_accepts_the_legacy_key(bridge_node, netns_factory):
    pod = netns_factory("pod")
    cid, _ = bridge_node.add(bridge_conf(pycni_ipam()), pod)
    conf = {
        **bridge_conf(pycni_ipam()),
        "cni.dev/attachments": [{"containerID": cid, "ifname": "eth0"}],
    }
    assert bridge_node.run("GC", conf, "").code == 0
    assert len(bridge_node.residue().veths) == 1


def test_status_is_forwarded_to_ipam(bridge_node):
    res = bridge_node.run("STATUS", bridge_conf(pycni_ipam()), "")
    assert res.code == 0, res.stdout
    broken = bridge_conf({"type": "no-such-ipam"})
    res = bridge_node.run("STATUS", broken, "")
    assert res.code != 0 and "no-such-ipam" in json.dumps(res.json)


def test_del_after_a_pycnid_restart(bridge_node, pycnid, netns_factory):
    pod = netns_factory("pod")
    conf = bridge_conf(pycni_ipam())
    cid, result = bridge_node.add(conf, pod)
    pycnid.stop()
    pycnid.start()
    check = bridge_node.run("CHECK", {**conf, "prevResult": result}, cid, pod.path)
    assert check.code == 0, check.stdout
    assert bridge_node.run("DEL", conf, cid, pod.path).code == 0
    assert bridge_node.residue().is_empty()


@pytest.mark.slow
@pytest.mark.parametrize("delay_ms", [0, 2, 5, 10, 20])
def test_sigkill_mid_add_then_del_leaves_nothing(bridge_node, pycnid, netns_factory, delay_ms):
    import threading
    import time

    pod = netns_factory("pod")
    conf = bridge_conf(pycni_ipam(), hairpinMode=True)
    cid = new_cid()
    worker = threading.Thread(target=bridge_node.run, args=("ADD", conf, cid, pod.path))
    worker.start()
    time.sleep(0.015 + delay_ms / 1000)  # the executable itself needs ~15 ms to reach pycnid
    pycnid.kill()
    worker.join(timeout=30)
    pycnid.start()
    res = bridge_node.run("DEL", conf, cid, pod.path)
    assert res.code == 0, res.stdout
    assert bridge_node.residue().is_empty(), bridge_node.residue()
    assert "eth0" not in container_links(pod)


SLOW_IPAM = """#!/bin/sh
# host-local, but ADD holds its answer back for a while (so pycnid can be killed meanwhile)
out=$(/usr/lib/cni/host-local); rc=$?
[ "$CNI_COMMAND" = ADD ] && sleep 2
echo "$out"; exit $rc
"""


def test_sigkill_while_ipam_answers_then_del_releases_the_lease(
    bridge_node, pycnid, netns_factory, tmp_path
):
    import threading
    import time

    from tests.fixtures.bridge import host_local_ipam

    (tmp_path / "slow-ipam").write_text(SLOW_IPAM)
    (tmp_path / "slow-ipam").chmod(0o755)
    bridge_node.cni_path = f"{tmp_path}:{bridge_node.cni_path}"
    conf = bridge_conf(
        {**host_local_ipam(bridge_node.host_local_dir), "type": "slow-ipam"}, version="1.0.0"
    )
    pod, cid = netns_factory("pod"), new_cid()
    worker = threading.Thread(target=bridge_node.run, args=("ADD", conf, cid, pod.path))
    worker.start()
    deadline = time.monotonic() + 10
    while not bridge_node.residue().leases and time.monotonic() < deadline:
        time.sleep(0.05)
    assert bridge_node.residue().leases, "IPAM never reserved an address"
    pycnid.kill()
    worker.join(timeout=30)
    pycnid.start()
    assert bridge_node.run("DEL", conf, cid, pod.path).code == 0
    assert bridge_node.residue().is_empty(), bridge_node.residue()

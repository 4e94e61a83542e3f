"""pycni-ipam under the reference main plugins (/usr/lib/cni bridge and ptp), run inside
the node namespace: pods get their leases, reach the gateway and each other; DEL frees."""

from __future__ import annotations

import pytest

from tests.fixtures.ipam import addresses, handles, run_reference

pytestmark = [pytest.mark.netns, pytest.mark.interop]


def bridge_conf(version: str = "1.0.0") -> dict:
    return {
        "cniVersion": version,
        "name": "refbr",
        "type": "bridge",
        "bridge": "refbr0",
        "isGateway": True,
        "ipMasq": False,
        "ipam": {
            "type": "pycni-ipam",
            "ranges": [[{"subnet": "10.67.0.0/24"}], [{"subnet": "fd67::/64"}]],
            "routes": [{"dst": "0.0.0.0/0"}],
        },
    }


def ptp_conf(version: str = "1.0.0") -> dict:
    return {
        "cniVersion": version,
        "name": "refptp",
        "type": "ptp",
        "ipMasq": False,
        "ipam": {
            "type": "pycni-ipam",
            "ranges": [[{"subnet": "10.68.0.0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}],
        },
    }


def wire(node, plugin, conf, pods, cni_bin, pycnid) -> list[dict]:
    results = []
    for i, pod in enumerate(pods):
        run = run_reference(
            node,
            plugin,
            "ADD",
            conf,
            cni_bin=cni_bin,
            socket=pycnid.socket,
            cid=f"{plugin}{i}",
            netns=pod.path,
        )
        assert run.ok, run.stdout + run.stderr
        results.append(run.json)
    return results


def pod_ipv4(result: dict) -> str:
    return next(a for a in addresses(result) if "." in a).split("/")[0]


@pytest.mark.parametrize("version", ["0.4.0", "1.0.0"])
def test_reference_bridge_with_pycni_ipam(version, node, pycnid, netns_factory, cni_bin):
    pods = [netns_factory("pod"), netns_factory("pod")]
    conf = bridge_conf(version)
    results = wire(node, "bridge", conf, pods, cni_bin, pycnid)
    assert [addresses(r) for r in results] == [
        ["10.67.0.2/24", "fd67::2/64"],
        ["10.67.0.3/24", "fd67::3/64"],
    ]
    assert "refbr0" in node.links()  # the bridge is in the node namespace
    assert "10.67.0.2/24" in pods[0].run(["ip", "-o", "addr", "show", "eth0"]).stdout
    assert pods[0].ping("10.67.0.1") and pods[0].ping(pod_ipv4(results[1]))
    assert pods[1].ping(pod_ipv4(results[0]))
    for i, pod in enumerate(pods):
        check = run_reference(
            node,
            "bridge",
            "CHECK",
            {**conf, "prevResult": results[i]},
            cni_bin=cni_bin,
            socket=pycnid.socket,
            cid=f"bridge{i}",
            netns=pod.path,
        )
        assert check.ok, check.stdout + check.stderr
    for i, pod in enumerate(pods):
        for _ in range(2):  # DEL is idempotent through the reference plugin too
            run = run_reference(
                node,
                "bridge",
                "DEL",
                {**conf, "prevResult": results[i]},
                cni_bin=cni_bin,
                socket=pycnid.socket,
                cid=f"bridge{i}",
                netns=pod.path,
            )
            assert run.ok, run.stdout + run.stderr
    assert handles(pycnid) == []


def test_reference_bridge_rolls_back_when_ipam_fails(node, pycnid, netns_factory, cni_bin):
    pod = netns_factory("pod")
    conf = bridge_conf()
    conf["ipam"]["ranges"] = [
        [{"subnet": "10.67.0.0/24", "rangeStart": "10.67.0.9", "rangeEnd": "10.67.0.9"}]
    ]
    wire(node, "bridge", conf, [pod], cni_bin, pycnid)
    second = run_reference(
        node,
        "bridge",
        "ADD",
        conf,
        cni_bin=cni_bin,
        socket=pycnid.socket,
        cid="bridge-x",
        netns=netns_factory("pod").path,
    )
    assert not second.ok and second.error_code() == 101, second.stdout
    assert "no address left in range" in second.json["msg"]
    assert [h.handle.container_id for h in handles(pycnid)] == ["bridge0"]


def test_reference_ptp_with_pycni_ipam(node, pycnid, netns_factory, cni_bin):
    pods = [netns_factory("pod"), netns_factory("pod")]
    conf = ptp_conf()
    results = wire(node, "ptp", conf, pods, cni_bin, pycnid)
    assert [addresses(r) for r in results] == [["10.68.0.2/24"], ["10.68.0.3/24"]]
    assert pods[0].ping("10.68.0.1")
    assert pods[0].ping("10.68.0.3") and pods[1].ping("10.68.0.2")
    for i, pod in enumerate(pods):
        run = run_reference(
            node,
            "ptp",
            "DEL",
            {**conf, "prevResult": results[i]},
            cni_bin=cni_bin,
            socket=pycnid.socket,
            cid=f"ptp{i}",
            netns=pod.path,
        )
        assert run.ok, run.stdout + run.stderr
    assert handles(pycnid) == []

"""The real pycni-ipam executable against a real pycnid (SQLite store, node namespace):
every verb in every spec version, the error codes, rollback, concurrency."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from cni.spec.versions import SUPPORTED
from tests.fixtures.ipam import addresses, allocations, handles, ipam_conf, run_ipam

pytestmark = pytest.mark.netns
POOL = "ipamnet-10.66.0.0-24"


@pytest.fixture
def pod(netns_factory):
    return netns_factory("pod")


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_verb_in_every_version(version, cni_bin, pycnid, pod):
    conf = ipam_conf(version, routes=[{"dst": "0.0.0.0/0"}], dns={"nameservers": ["10.66.0.53"]})
    add = run_ipam(
        cni_bin,
        pycnid,
        "ADD",
        conf,
        netns=pod.path,
        args="K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;IgnoreUnknown=1",
    )
    assert add.ok, add.stdout + add.stderr
    result = add.json
    assert result["cniVersion"] == version
    expected_ip = {"address": "10.66.0.2/24", "gateway": "10.66.0.1"}
    if version in ("0.3.0", "0.3.1", "0.4.0"):
        expected_ip["version"] = "4"
    assert result["ips"] == [expected_ip]  # abbreviated: no interface index
    assert "interfaces" not in result
    assert result["routes"] == [{"dst": "0.0.0.0/0"}]
    assert result["dns"] == {"nameservers": ["10.66.0.53"]}
    (lease,) = handles(pycnid, "ipamnet")
    assert dict(lease.attributes) == {"namespace": "default", "pod": "web-0", "node": "node1"}

    if version != "0.3.0" and version != "0.3.1":
        check = run_ipam(cni_bin, pycnid, "CHECK", {**conf, "prevResult": result}, netns=pod.path)
        assert check.ok and check.stdout == "", check.stdout
    if version == "1.1.0":
        assert run_ipam(cni_bin, pycnid, "STATUS", conf).ok
        gc = run_ipam(
            cni_bin,
            pycnid,
            "GC",
            {**conf, "cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "eth0"}]},
        )
        assert gc.ok and len(handles(pycnid, "ipamnet")) == 1
    else:
        status = run_ipam(cni_bin, pycnid, "STATUS", conf)
        assert status.error_code() == 1  # STATUS needs 1.1.0
    again = run_ipam(cni_bin, pycnid, "ADD", conf, netns=pod.path)
    assert addresses(again.json) == ["10.66.0.2/24"]
    assert run_ipam(cni_bin, pycnid, "DEL", {**conf, "prevResult": result}).ok
    assert run_ipam(cni_bin, pycnid, "DEL", conf).ok  # twice, and without prevResult
    assert handles(pycnid) == [] and allocations(pycnid, POOL) == {}


def test_dual_stack_add(cni_bin, pycnid, pod):
    conf = ipam_conf("1.1.0", ranges=[[{"subnet": "10.66.0.0/24"}], [{"subnet": "fd66::/64"}]])
    add = run_ipam(cni_bin, pycnid, "ADD", conf, netns=pod.path)
    assert add.ok, add.stdout
    assert add.json["ips"] == [
        {"address": "10.66.0.2/24", "gateway": "10.66.0.1"},
        {"address": "fd66::2/64", "gateway": "fd66::1"},
    ]


def test_dual_stack_exhausted_v6_leaves_nothing(cni_bin, pycnid, pod):
    conf = ipam_conf(
        "1.1.0",
        ranges=[
            [{"subnet": "10.66.0.0/24"}],
            [{"subnet": "fd66::/120", "rangeStart": "fd66::7", "rangeEnd": "fd66::7"}],
        ],
    )
    assert run_ipam(cni_bin, pycnid, "ADD", conf, cid="c1", netns=pod.path).ok
    second = run_ipam(cni_bin, pycnid, "ADD", conf, cid="c2", netns=pod.path)
    assert second.error_code() == 101
    assert (
        "no address left in range fd66::/120 (fd66::7-fd66::7) for node node1"
        in second.json["msg"]
    )
    assert [str(h.handle) for h in handles(pycnid)] == ["ipamnet/c1/eth0"]
    assert list(allocations(pycnid, POOL)) == ["10.66.0.2"]
    status = run_ipam(cni_bin, pycnid, "STATUS", conf)
    assert status.error_code() == 50 and "no address left" in status.json["msg"]


def test_static_requests_and_conflict(cni_bin, pycnid, pod):
    conf = ipam_conf("1.1.0", capabilities={"ips": True})
    one = run_ipam(cni_bin, pycnid, "ADD", conf, cid="c1", netns=pod.path, args="IP=10.66.0.77")
    assert addresses(one.json) == ["10.66.0.77/24"]
    two = run_ipam(
        cni_bin,
        pycnid,
        "ADD",
        {**conf, "runtimeConfig": {"ips": ["10.66.0.77/24"]}},
        cid="c2",
        netns=pod.path,
    )
    assert two.error_code() == 102 and "ipamnet/c1/eth0" in two.json["msg"]
    three = run_ipam(
        cni_bin,
        pycnid,
        "ADD",
        {**conf, "args": {"cni": {"ips": ["10.66.0.78"]}}},
        cid="c3",
        netns=pod.path,
    )
    assert addresses(three.json) == ["10.66.0.78/24"]
    outside = run_ipam(cni_bin, pycnid, "ADD", conf, cid="c4", netns=pod.path, args="IP=10.99.0.1")
    assert outside.error_code() == 7 and "outside every range" in outside.json["msg"]
    assert sorted(allocations(pycnid, POOL)) == ["10.66.0.77", "10.66.0.78"]


@pytest.mark.parametrize(
    "ipam, key",
    [
        ({"ranges": [[{"subnet": "10.66.0.5/24"}]]}, "ipam.ranges[0][0].subnet"),
        (
            {"ranges": [[{"subnet": "10.66.0.0/24", "rangeEnd": "10.67.0.9"}]]},
            "ipam.ranges[0][0].rangeEnd",
        ),
        ({"ranges": []}, "ipam.ranges"),
    ],
)
def test_invalid_config_is_code_7_naming_the_key(ipam, key, cni_bin, pycnid, pod):
    conf = {**ipam_conf("1.0.0"), "ipam": {"type": "pycni-ipam", **ipam}}
    run = run_ipam(cni_bin, pycnid, "ADD", conf, netns=pod.path)
    assert run.code != 0 and run.error_code() == 7
    assert key in run.json["msg"] + run.json.get("details", "")


def test_exhaustion_is_101_and_status_50(cni_bin, pycnid, pod):
    conf = ipam_conf("1.1.0", ranges=[[{"subnet": "10.66.0.0/29"}]])  # .2 - .6
    for i in range(5):
        assert run_ipam(cni_bin, pycnid, "ADD", conf, cid=f"c{i}", netns=pod.path).ok
    full = run_ipam(cni_bin, pycnid, "ADD", conf, cid="c9", netns=pod.path)
    assert full.error_code() == 101
    assert full.json["msg"] == (
        "no address left in range 10.66.0.0/29 (10.66.0.1-10.66.0.6) "
        "for node node1 (pool ipamnet-10.66.0.0-29)"
    )
    assert run_ipam(cni_bin, pycnid, "STATUS", conf).error_code() == 50
    assert run_ipam(cni_bin, pycnid, "DEL", conf, cid="c3").ok
    assert run_ipam(cni_bin, pycnid, "STATUS", conf).ok
    assert addresses(run_ipam(cni_bin, pycnid, "ADD", conf, cid="c9", netns=pod.path).json) == [
        "10.66.0.5/29"
    ]


def test_check_names_what_differs(cni_bin, pycnid, pod):
    conf = ipam_conf("1.0.0")
    result = run_ipam(cni_bin, pycnid, "ADD", conf, netns=pod.path).json
    wrong = {**result, "ips": [{"address": "10.66.0.9/24", "gateway": "10.66.0.1"}]}
    check = run_ipam(cni_bin, pycnid, "CHECK", {**conf, "prevResult": wrong}, netns=pod.path)
    assert check.error_code() == 100
    assert "10.66.0.9" in check.json["details"] and "10.66.0.2" in check.json["details"]
    missing = run_ipam(
        cni_bin, pycnid, "CHECK", {**conf, "prevResult": result}, cid="other", netns=pod.path
    )
    assert missing.error_code() == 100 and "ipamnet/other/eth0" in missing.json["msg"]


def test_gc_releases_what_is_not_valid(cni_bin, pycnid, pod):
    conf = ipam_conf("1.1.0")
    for cid in ("keep", "gone1", "gone2"):
        assert run_ipam(cni_bin, pycnid, "ADD", conf, cid=cid, netns=pod.path).ok
    legacy = {**conf, "cni.dev/attachments": [{"containerID": "keep", "ifname": "eth0"}]}
    assert run_ipam(cni_bin, pycnid, "GC", legacy).ok
    assert [h.handle.container_id for h in handles(pycnid)] == ["keep"]
    assert run_ipam(cni_bin, pycnid, "GC", conf).ok  # no key at all: nothing is valid
    assert handles(pycnid) == []


def test_fault_after_commit_rolls_the_lease_back(cni_bin, pycnid, pod):
    conf = ipam_conf("1.0.0")
    for step in ("ipam-allocate", "ipam-result"):
        failed = run_ipam(cni_bin, pycnid, "ADD", conf, netns=pod.path, args=f"PYCNI_FAULT={step}")
        assert failed.code != 0 and step in failed.json["msg"]
        assert handles(pycnid) == [] and allocations(pycnid, POOL) == {}
    assert run_ipam(cni_bin, pycnid, "ADD", conf, netns=pod.path).ok


def test_missing_netns_on_add_is_an_error_and_leases_nothing(cni_bin, pycnid):
    run = run_ipam(cni_bin, pycnid, "ADD", ipam_conf(), netns="/var/run/netns/pycni-nope")
    assert run.code != 0 and handles(pycnid) == []


def test_fifty_concurrent_adds_get_unique_addresses_then_dels_leave_nothing(cni_bin, pycnid, pod):
    conf = ipam_conf("1.1.0", ranges=[[{"subnet": "10.66.0.0/24"}], [{"subnet": "fd66::/64"}]])
    with ThreadPoolExecutor(max_workers=50) as pool:
        adds = list(
            pool.map(
                lambda i: run_ipam(cni_bin, pycnid, "ADD", conf, cid=f"pod{i}", netns=pod.path),
                range(50),
            )
        )
    assert all(a.ok for a in adds), [a.stdout for a in adds if not a.ok]
    got = [ip for a in adds for ip in addresses(a.json)]
    assert len(got) == 100 and len(set(got)) == 100
    assert len(handles(pycnid)) == 50
    with ThreadPoolExecutor(max_workers=50) as pool:
        dels = list(
            pool.map(lambda i: run_ipam(cni_bin, pycnid, "DEL", conf, cid=f"pod{i}"), range(50))
        )
    assert all(d.ok for d in dels)
    assert handles(pycnid) == [] and allocations(pycnid, POOL) == {}


def test_daemon_restart_keeps_leases(cni_bin, pycnid, pod):
    conf = ipam_conf("1.0.0")
    first = run_ipam(cni_bin, pycnid, "ADD", conf, cid="c1", netns=pod.path).json
    pycnid.stop()
    pycnid.start()
    assert run_ipam(cni_bin, pycnid, "ADD", conf, cid="c1", netns=pod.path).json == first
    assert addresses(run_ipam(cni_bin, pycnid, "ADD", conf, cid="c2", netns=pod.path).json) == [
        "10.66.0.3/24"
    ]
    assert os.path.exists(pycnid.config["store"]["path"])

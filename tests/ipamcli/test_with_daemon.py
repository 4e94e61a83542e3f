"""An operator's day with a real pycnid (node namespace, SQLite) and the pycni-ipam executable:
`pycni ipam` finds the store through the daemon's own config file, makes the pools the netconf
names, and its show/check/release/pool set agree with what the daemon hands out."""

from __future__ import annotations

import ipaddress
import json

import pytest

from tests.fixtures.ipam import run_ipam
from tests.ipamcli.test_pycni_command import pycni

pytestmark = pytest.mark.netns


def conf(version: str = "1.1.0") -> dict:
    return {
        "cniVersion": version,
        "name": "clinet",
        "type": "ptp",
        "ipam": {"type": "pycni-ipam", "pools": ["cli4", "cli6"]},
    }


def test_operator_and_daemon_agree(cni_bin, pycnid, netns_factory):
    config = f"{pycnid.workdir}/pycnid.json"  # what the daemon was started with

    def ipam(*args: str, code: int = 0):
        out = pycni(*args, "--config", config, "-o", "json", code=code).stdout
        return json.loads(out) if out.strip() else None

    ipam("pool", "add", "cli4", "--cidr", "10.77.0.0/24", "--gateway", "first")
    ipam("pool", "add", "cli6", "--cidr", "fd77::/120", "--block-size", "122")
    pods = [netns_factory("pod") for _ in range(3)]
    results = []
    for i, pod in enumerate(pods):
        add = run_ipam(
            cni_bin,
            pycnid,
            "ADD",
            conf(),
            cid=f"c{i}",
            netns=pod.path,
            args=f"K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web-{i}",
        )
        assert add.ok, add.stdout + add.stderr
        results.append(add.json)
    v4 = results[0]["ips"][0]
    ip = ipaddress.ip_interface(v4["address"]).ip
    block = ipaddress.ip_network(f"{ip}/26", strict=False)
    first = block.network_address + (1 if block.network_address.packed[-1] == 0 else 0)
    assert v4["address"].startswith("10.77.0.") and v4["gateway"] == str(first)
    assert ipam("check")["ok"] is True
    used = {p["name"]: p["used"] for p in ipam("show")["pools"]}
    assert used == {"cli4": 3, "cli6": 3}
    (held,) = ipam("show", v4["address"])["matches"]
    assert (held["state"], held["handle"], held["pod"], held["node"]) == (
        "allocated",
        "clinet/c0/eth0",
        "web-0",
        "node1",
    )
    assert ipam("show", v4["gateway"])["matches"][0]["state"] == "reserved"

    # an operator frees c1's IPv4 by hand: the daemon's DEL of c1 still succeeds
    freed = results[1]["ips"][0]["address"].split("/")[0]
    assert ipam("release", freed)["handles"] == ["clinet/c1/eth0"]
    assert run_ipam(cni_bin, pycnid, "DEL", conf(), cid="c1").ok
    assert ipam("check")["ok"] is True

    # a disabled pool hands out nothing new; enabled again, it does
    ipam("pool", "set", "cli4", "--disabled")
    refused = run_ipam(cni_bin, pycnid, "ADD", conf(), cid="c9", netns=pods[1].path)
    assert not refused.ok and "cli4" in refused.stdout
    assert ipam("show", "c9", code=1) is None  # nothing half-written
    ipam("pool", "set", "cli4", "--enabled")
    again = run_ipam(cni_bin, pycnid, "ADD", conf(), cid="c9", netns=pods[1].path)
    assert again.ok, again.stdout + again.stderr
    assert again.json["ips"][0]["address"].split("/")[0] != freed  # still cooling

    assert (
        "still has addresses in use"
        in pycni("pool", "rm", "cli4", "--config", config, code=1).stderr
    )
    for cid in ("c0", "c2", "c9"):
        assert run_ipam(cni_bin, pycnid, "DEL", conf(), cid=cid).ok
    assert ipam("pool", "rm", "cli4")["removed"] and ipam("pool", "rm", "cli6")["removed"]
    final = ipam("check")
    assert final["ok"] and final["counts"]["handles"] == 0 and final["counts"]["blocks"] == 0

"""Result conversion for every version pair, as the reference library
converts them."""

from __future__ import annotations

import itertools

import pytest

from cni.spec.errors import DecodingFailure
from cni.spec.result import canonical, convert, render
from cni.spec.versions import SUPPORTED

FULL = {
    "cniVersion": "1.1.0",
    "interfaces": [
        {"name": "pycni0", "mac": "aa:bb:cc:dd:ee:01"},
        {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:02", "mtu": 1400},
        {
            "name": "eth0",
            "mac": "aa:bb:cc:dd:ee:03",
            "sandbox": "/var/run/netns/p1",
            "mtu": 1400,
            "socketPath": "/x.sock",
            "pciID": "0000:00:01.0",
        },
    ],
    "ips": [
        {"address": "10.22.0.5/24", "gateway": "10.22.0.1", "interface": 2},
        {"address": "fd00::5/64", "gateway": "fd00::1", "interface": 2},
    ],
    "routes": [
        {"dst": "0.0.0.0/0", "gw": "10.22.0.1", "mtu": 1400, "priority": 5, "scope": 0},
        {"dst": "::/0"},
    ],
    "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]},
}


def expected_shape(version: str, result: dict, source: str) -> None:
    assert result["cniVersion"] == version
    v1 = version.startswith("1.")
    for ip in result["ips"]:
        if v1:
            assert "version" not in ip
        else:
            assert ip["version"] == ("4" if "." in ip["address"] else "6")
    container = result["interfaces"][2]
    if version == "1.1.0" and source.startswith("1."):
        assert container["socketPath"] == "/x.sock" and container["mtu"] == 1400
    if not v1:
        assert set(container) == {"name", "mac", "sandbox"}
        assert all(set(r) <= {"dst", "gw"} for r in result["routes"])


@pytest.mark.parametrize("source,target", list(itertools.product(SUPPORTED, SUPPORTED)))
def test_every_version_pair(source: str, target: str) -> None:
    start = render(canonical(FULL), source)
    out = convert(start, target)
    expected_shape(target, out, source)
    assert [ip["address"] for ip in out["ips"]] == ["10.22.0.5/24", "fd00::5/64"]
    assert [ip["interface"] for ip in out["ips"]] == [2, 2]
    assert out["routes"][0]["dst"] == "0.0.0.0/0" and out["routes"][0]["gw"] == "10.22.0.1"
    assert out["dns"] == FULL["dns"]
    assert [i["name"] for i in out["interfaces"]] == ["pycni0", "veth1234", "eth0"]


def test_round_trip_through_old_version_keeps_core_fields() -> None:
    back = convert(convert(FULL, "0.3.0"), "1.1.0")
    assert back["ips"] == FULL["ips"]
    assert back["interfaces"][2]["sandbox"] == "/var/run/netns/p1"


def test_abbreviated_ipam_result_has_no_interfaces() -> None:
    ipam = {"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.1.0.2/16"}]}
    out = convert(ipam, "1.0.0")
    assert "interfaces" not in out
    assert out["ips"] == [{"address": "10.1.0.2/16"}]


def test_result_without_version_takes_the_given_one() -> None:
    out = canonical({"ips": [{"address": "10.1.0.2/16", "version": "4"}]}, "0.4.0")
    assert out["ips"] == [{"address": "10.1.0.2/16"}]


@pytest.mark.parametrize(
    "garbage",
    ["text", 5, None, [1], {"ips": [{"address": "nope"}]}, {"ips": "x"}, {"cniVersion": "one"}],
)
def test_garbage_is_a_decoding_failure(garbage) -> None:
    with pytest.raises(DecodingFailure) as exc:
        canonical(garbage)
    assert exc.value.code == 6

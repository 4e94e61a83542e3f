"""The IPAM netconf is validated once per distinct config; bad configs fail every time."""

from __future__ import annotations

import pytest

from cni.spec.errors import InvalidConfig
from ipam.records import HandleId, HandleRecord
from plugins.ipam import config as ipam_config
from plugins.ipam.config import cached_ipam_config
from plugins.ipam.plugin import render_result


def conf(subnet: str = "10.30.0.0/16", **extra) -> dict:
    return {
        "cniVersion": "1.1.0",
        "name": "net",
        "type": "ptp",
        "ipam": {
            "type": "pycni-ipam",
            "ranges": [[{"subnet": subnet}]],
            "dns": {"nameservers": ["10.0.0.10"]},
        },
        **extra,
    }


def test_the_same_netconf_is_parsed_once() -> None:
    first = cached_ipam_config(conf())
    assert cached_ipam_config(conf()) is first  # another request, equal config
    assert cached_ipam_config(conf("10.31.0.0/16")) is not first
    other = cached_ipam_config({**conf(), "name": "net2"})
    assert other.network == "net2" and first.network == "net"


def test_keys_outside_the_ipam_section_do_not_matter_but_ip_ranges_do() -> None:
    base = cached_ipam_config(conf())
    assert cached_ipam_config(conf(runtimeConfig={"portMappings": []})) is base
    by_cap = cached_ipam_config(conf(runtimeConfig={"ipRanges": [[{"subnet": "10.40.0.0/24"}]]}))
    assert str(by_cap.range_sets[0][0].subnet) == "10.40.0.0/24"


def test_a_bad_netconf_fails_the_same_way_every_time() -> None:
    bad = conf("10.30.0.1/16")
    messages = []
    for _ in range(3):
        with pytest.raises(InvalidConfig) as info:
            cached_ipam_config(bad)
        messages.append((info.value.code, info.value.msg, info.value.details))
    assert messages[0][0] == 7 and "ipam.ranges[0][0].subnet" in messages[0][1]
    assert messages.count(messages[0]) == 3


def test_the_cache_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(ipam_config, "CACHE_SIZE", 4)
    for i in range(10):
        cached_ipam_config(conf(f"10.{50 + i}.0.0/16"))
    assert len(ipam_config._parsed) <= 4


def test_results_do_not_share_the_cached_dns_or_routes() -> None:
    cfg = cached_ipam_config(conf())
    record = HandleRecord(HandleId("net", "c1", "eth0"), ())
    result = render_result(record, cfg)
    result["dns"]["nameservers"].append("changed")
    assert render_result(record, cfg)["dns"] == {"nameservers": ["10.0.0.10"]}

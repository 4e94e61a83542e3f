"""The result cache in libcni's cniCacheV1 format: round trip, Go-written entries, conversion."""

from __future__ import annotations

import base64
import json
import os
import pathlib
import stat

import pytest

from cni.runtime import cache
from cni.runtime.cache import CacheEntry, CorruptCache

RESULT_100 = {
    "cniVersion": "1.0.0",
    "interfaces": [
        {"name": "cni0", "mac": "aa:bb:cc:dd:ee:01"},
        {"name": "eth0", "mac": "aa:bb:cc:dd:ee:02", "sandbox": "/run/netns/p"},
    ],
    "ips": [{"interface": 1, "address": "10.22.0.5/24", "gateway": "10.22.0.1"}],
    "routes": [{"dst": "0.0.0.0/0"}],
    "dns": {},
}
CONF = b'{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"bridge"}]}'

# Exactly what libcni 1.1.2 (Debian golang-github-appc-cni-dev) writes: no "netns" yet.
GO_WRITTEN = json.dumps(
    {
        "kind": "cniCacheV1",
        "containerId": "c1",
        "config": base64.b64encode(CONF).decode(),
        "ifName": "eth0",
        "networkName": "net",
        "cniArgs": [["K8S_POD_NAME", "web"]],
        "capabilityArgs": {"portMappings": [{"hostPort": 8080, "containerPort": 80}]},
        "result": RESULT_100,
    },
    separators=(",", ":"),
)


def entry(**kw) -> CacheEntry:
    base = dict(
        container_id="c1",
        ifname="eth0",
        network_name="net",
        config=CONF,
        netns="/run/netns/p",
        cni_args=(("K", "V"),),
        capability_args={"portMappings": []},
        result=RESULT_100,
    )
    return CacheEntry(**{**base, **kw})


def test_round_trip_and_permissions(tmp_path):
    path = cache.write_cached(str(tmp_path), entry())
    assert path == str(tmp_path / "results" / "net-c1-eth0")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "results").st_mode) == 0o700
    assert cache.read_cached_entry(str(tmp_path), "net", "c1", "eth0") == entry()


def test_written_json_has_libcni_field_names_and_encodings(tmp_path):
    path = cache.write_cached(str(tmp_path), entry())
    data = json.loads(pathlib.Path(path).read_text())
    assert list(data) == [
        "kind",
        "containerId",
        "config",
        "ifName",
        "networkName",
        "netns",
        "cniArgs",
        "capabilityArgs",
        "result",
    ]
    assert data["kind"] == "cniCacheV1"
    assert base64.b64decode(data["config"]) == CONF
    assert data["cniArgs"] == [["K", "V"]]


def test_empty_optionals_are_omitted_like_go_omitempty(tmp_path):
    path = cache.write_cached(str(tmp_path), entry(netns="", cni_args=None, capability_args=None))
    assert set(json.loads(pathlib.Path(path).read_text())) == {
        "kind",
        "containerId",
        "config",
        "ifName",
        "networkName",
        "result",
    }


def test_reads_an_entry_written_by_libcni(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "net-c1-eth0").write_text(GO_WRITTEN)
    got = cache.read_cached_entry(str(tmp_path), "net", "c1", "eth0")
    assert got.config == CONF and got.netns == ""
    assert got.cni_args == (("K8S_POD_NAME", "web"),)
    assert got.capability_args["portMappings"][0]["hostPort"] == 8080
    assert cache.read_cached_result(str(tmp_path), "net", "c1", "eth0", "1.0.0") == RESULT_100


def test_cached_result_is_converted_to_the_config_version(tmp_path):
    cache.write_cached(str(tmp_path), entry())
    old = cache.read_cached_result(str(tmp_path), "net", "c1", "eth0", "0.4.0")
    assert old["cniVersion"] == "0.4.0"
    assert old["ips"] == [
        {"version": "4", "interface": 1, "address": "10.22.0.5/24", "gateway": "10.22.0.1"}
    ]
    new = cache.read_cached_result(str(tmp_path), "net", "c1", "eth0", "1.1.0")
    assert new["cniVersion"] == "1.1.0" and "version" not in new["ips"][0]


def test_older_cached_result_is_upgraded(tmp_path):
    result_040 = {
        "cniVersion": "0.4.0",
        "ips": [{"version": "4", "address": "10.0.0.2/24"}],
        "dns": {},
    }
    cache.write_cached(str(tmp_path), entry(result=result_040))
    got = cache.read_cached_result(str(tmp_path), "net", "c1", "eth0", "1.0.0")
    assert got == {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}], "dns": {}}


def test_same_version_is_passed_verbatim(tmp_path):
    result = {**RESULT_100, "x-extra": 1}
    cache.write_cached(str(tmp_path), entry(result=result))
    assert cache.read_cached_result(str(tmp_path), "net", "c1", "eth0", "1.0.0") == result


def test_legacy_bare_result_file_is_read(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "net-c1-eth0").write_text(json.dumps(RESULT_100))
    got = cache.read_cached_result(str(tmp_path), "net", "c1", "eth0", "0.4.0")
    assert got["ips"][0]["version"] == "4"


def test_missing_cache_is_none(tmp_path):
    assert cache.read_cached_result(str(tmp_path), "net", "c1", "eth0", "1.0.0") is None
    assert cache.read_cached_entry(str(tmp_path), "net", "c1", "eth0") is None


@pytest.mark.parametrize(
    "content",
    [
        "",
        "{garbage",
        '{"kind":"cniCacheV1","config":"%%%"}',
        '{"kind":"cniCacheV1","result":{"ips":"nope"}}',
        '{"kind":"cniCacheV1","result":{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2/24"}}}',
    ],
)
def test_corrupt_cache_raises_corrupt_cache(tmp_path, content):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "net-c1-eth0").write_text(content)
    with pytest.raises(CorruptCache) as err:
        cache.read_cached_result(str(tmp_path), "net", "c1", "eth0", "1.0.0")
    assert err.value.code == 6 and "net-c1-eth0" in err.value.msg


def test_remove_is_idempotent(tmp_path):
    cache.write_cached(str(tmp_path), entry())
    cache.remove_cached(str(tmp_path), "net", "c1", "eth0")
    cache.remove_cached(str(tmp_path), "net", "c1", "eth0")
    assert not os.listdir(tmp_path / "results")


def test_cache_path_needs_all_three_parts(tmp_path):
    with pytest.raises(Exception) as err:
        cache.cache_file(str(tmp_path), "net", "", "eth0")
    assert "container ID" in str(err.value)


def test_cached_attachments_lists_valid_v1_entries_only(tmp_path):
    cache.write_cached(str(tmp_path), entry(container_id="a"))
    cache.write_cached(str(tmp_path), entry(container_id="b", network_name="other"))
    (tmp_path / "results" / "net-junk-eth0").write_text("{junk")
    (tmp_path / "results" / "net-legacy-eth0").write_text(json.dumps(RESULT_100))
    found = cache.cached_attachments(str(tmp_path))
    assert [(e.network_name, e.container_id) for e in found] == [("net", "a"), ("other", "b")]
    assert cache.cached_attachments(str(tmp_path / "missing")) == []

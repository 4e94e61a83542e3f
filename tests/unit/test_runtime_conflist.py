"""Loading network configuration lists with libcni's rules."""

from __future__ import annotations

import json
import os

import pytest

from cni.runtime.conflist import NetworkNotFound, conflist_from_bytes, load_network_conf
from cni.spec.errors import CNIError
from tests.fixtures.runtime import write_conflist


def plugin(kind: str, **extra) -> dict:
    return {"type": kind, **extra}


def test_first_matching_conflist_in_lexical_order_wins(tmp_path):
    write_conflist(
        tmp_path,
        "20-b.conflist",
        {"cniVersion": "1.0.0", "name": "net", "plugins": [plugin("second")]},
    )
    write_conflist(
        tmp_path,
        "10-a.conflist",
        {"cniVersion": "1.0.0", "name": "net", "plugins": [plugin("first")]},
    )
    write_conflist(
        tmp_path,
        "05-other.conflist",
        {"cniVersion": "1.0.0", "name": "other", "plugins": [plugin("x")]},
    )
    conf = load_network_conf(str(tmp_path), "net")
    assert [p.type for p in conf.plugins] == ["first"]
    assert conf.source.endswith("10-a.conflist")
    assert conf.raw == (tmp_path / "10-a.conflist").read_bytes()


def test_conflist_is_preferred_over_a_legacy_conf_of_the_same_name(tmp_path):
    write_conflist(
        tmp_path, "00-legacy.conf", {"cniVersion": "0.4.0", "name": "net", "type": "legacy"}
    )
    write_conflist(
        tmp_path,
        "99-list.conflist",
        {"cniVersion": "1.0.0", "name": "net", "plugins": [plugin("listed")]},
    )
    assert [p.type for p in load_network_conf(str(tmp_path), "net").plugins] == ["listed"]


@pytest.mark.parametrize("ext", [".conf", ".json"])
def test_legacy_single_plugin_config_is_up_converted(tmp_path, ext):
    write_conflist(
        tmp_path,
        f"10-old{ext}",
        {"cniVersion": "0.3.1", "name": "old", "type": "bridge", "bridge": "br9"},
    )
    conf = load_network_conf(str(tmp_path), "old")
    assert conf.name == "old" and conf.cni_version == "0.3.1"
    assert len(conf.plugins) == 1 and conf.plugins[0].raw["bridge"] == "br9"
    raw = json.loads(conf.raw)
    assert raw["plugins"][0]["type"] == "bridge" and raw["name"] == "old"


def test_plugin_fragments_are_appended_in_order(tmp_path):
    write_conflist(
        tmp_path,
        "10.conflist",
        {"cniVersion": "1.1.0", "name": "net", "plugins": [plugin("main")]},
    )
    write_conflist(tmp_path / "net", "20-b.conf", plugin("frag-b"))
    write_conflist(tmp_path / "net", "10-a.conf", plugin("frag-a"))
    write_conflist(tmp_path / "net", "ignored.json", plugin("not-a-fragment"))
    conf = load_network_conf(str(tmp_path), "net")
    assert [p.type for p in conf.plugins] == ["main", "frag-a", "frag-b"]


def test_fragments_alone_may_supply_the_plugins(tmp_path):
    write_conflist(tmp_path, "10.conflist", {"cniVersion": "1.1.0", "name": "net"})
    write_conflist(tmp_path / "net", "a.conf", plugin("frag"))
    assert [p.type for p in load_network_conf(str(tmp_path), "net").plugins] == ["frag"]


def test_load_only_inlined_plugins_ignores_fragments(tmp_path):
    write_conflist(
        tmp_path,
        "10.conflist",
        {
            "cniVersion": "1.1.0",
            "name": "net",
            "loadOnlyInlinedPlugins": "true",
            "plugins": [plugin("main")],
        },
    )
    write_conflist(tmp_path / "net", "a.conf", plugin("frag"))
    conf = load_network_conf(str(tmp_path), "net")
    assert conf.load_only_inlined_plugins is True
    assert [p.type for p in conf.plugins] == ["main"]


def test_load_only_inlined_plugins_requires_plugins():
    with pytest.raises(CNIError) as err:
        conflist_from_bytes(b'{"name": "n", "loadOnlyInlinedPlugins": true}')
    assert err.value.code == 7 and "loadOnlyInlinedPlugins" in err.value.msg


def test_a_list_without_any_plugin_is_refused(tmp_path):
    write_conflist(tmp_path, "10.conflist", {"cniVersion": "1.1.0", "name": "net"})
    with pytest.raises(CNIError) as err:
        load_network_conf(str(tmp_path), "net")
    assert err.value.code == 7 and "no plugin configs" in err.value.msg


@pytest.mark.parametrize(
    "value,expected",
    [(True, True), ("true", True), ("TRUE", True), ("false", False), (False, False)],
)
def test_booleans_accept_true_false_strings(value, expected):
    data = json.dumps(
        {"name": "n", "disableCheck": value, "disableGC": value, "plugins": [plugin("p")]}
    ).encode()
    conf = conflist_from_bytes(data)
    assert conf.disable_check is expected and conf.disable_gc is expected


def test_a_boolean_that_is_not_one_names_the_key():
    with pytest.raises(CNIError) as err:
        conflist_from_bytes(b'{"name": "n", "disableGC": "yes", "plugins": [{"type": "p"}]}')
    assert err.value.code == 7 and "disableGC" in err.value.msg


def test_cni_versions_picks_the_highest_implemented():
    data = json.dumps(
        {
            "name": "n",
            "cniVersion": "0.4.0",
            "cniVersions": ["1.0.0", "9.9.9", "1.1.0", "0.3.1"],
            "plugins": [plugin("p")],
        }
    ).encode()
    assert conflist_from_bytes(data).cni_version == "1.1.0"


def test_cni_versions_without_cni_version():
    data = b'{"name": "n", "cniVersions": ["0.4.0", "1.0.0"], "plugins": [{"type": "p"}]}'
    assert conflist_from_bytes(data).cni_version == "1.0.0"


def test_an_invalid_cni_versions_entry_is_a_decoding_error():
    with pytest.raises(CNIError) as err:
        conflist_from_bytes(b'{"name": "n", "cniVersions": ["1.0"], "plugins": [{"type": "p"}]}')
    assert err.value.code == 6


def test_plugin_without_type_is_invalid():
    with pytest.raises(CNIError) as err:
        conflist_from_bytes(b'{"name": "n", "plugins": [{"bridge": "x"}]}')
    assert err.value.code == 7 and "type" in err.value.details


def test_a_broken_conflist_earlier_in_order_fails_the_lookup_and_is_named(tmp_path):
    (tmp_path / "00-broken.conflist").write_text("{not json")
    write_conflist(tmp_path, "10.conflist", {"name": "net", "plugins": [plugin("p")]})
    with pytest.raises(CNIError) as err:
        load_network_conf(str(tmp_path), "net")
    assert err.value.code == 6 and "00-broken.conflist" in err.value.msg


def test_missing_directory_says_no_configurations(tmp_path):
    with pytest.raises(NetworkNotFound) as err:
        load_network_conf(str(tmp_path / "nope"), "net")
    assert "no net configurations found" in err.value.msg and err.value.code == 7


def test_unknown_name_lists_what_was_looked_at(tmp_path):
    write_conflist(tmp_path, "10-a.conflist", {"name": "a", "plugins": [plugin("p")]})
    with pytest.raises(NetworkNotFound) as err:
        load_network_conf(str(tmp_path), "b")
    assert 'name "b"' in err.value.msg and "10-a.conflist" in err.value.details


def test_directories_named_like_configs_are_skipped(tmp_path):
    os.makedirs(tmp_path / "dir.conflist")
    write_conflist(tmp_path, "10.conflist", {"name": "n", "plugins": [plugin("p")]})
    assert load_network_conf(str(tmp_path), "n").name == "n"

"""Env and config validation: the right spec code and a message naming the problem."""

from __future__ import annotations

import json

import pytest

from cni.spec.errors import CNIError, error_from_dict
from cni.spec.request import gc_valid_attachments, parse_cni_args, parse_config, parse_env
from cni.spec.versions import validate_version, version_info

GOOD = {
    "CNI_COMMAND": "ADD",
    "CNI_CONTAINERID": "abc-1.2_3",
    "CNI_NETNS": "/var/run/netns/x",
    "CNI_IFNAME": "eth0",
    "CNI_PATH": "/opt/cni/bin:/usr/lib/cni",
}


def code_of(fn, *args) -> tuple[int, str]:
    with pytest.raises(CNIError) as exc:
        fn(*args)
    return exc.value.code, str(exc.value)


def test_good_env_parses() -> None:
    env = parse_env({**GOOD, "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAME=web;Odd=x"})
    assert env.container_id == "abc-1.2_3" and env.ifname == "eth0"
    assert env.path == ("/opt/cni/bin", "/usr/lib/cni")
    assert env.args["K8S_POD_NAME"] == "web" and env.args["Odd"] == "x"


@pytest.mark.parametrize(
    "change,named",
    [
        ({"CNI_COMMAND": "FOO"}, "CNI_COMMAND"),
        ({"CNI_CONTAINERID": ""}, "CNI_CONTAINERID"),
        ({"CNI_CONTAINERID": "-bad"}, "CNI_CONTAINERID"),
        ({"CNI_CONTAINERID": "a/b"}, "CNI_CONTAINERID"),
        ({"CNI_NETNS": ""}, "CNI_NETNS"),
        ({"CNI_IFNAME": ""}, "CNI_IFNAME"),
        ({"CNI_IFNAME": "x" * 16}, "CNI_IFNAME"),
        ({"CNI_IFNAME": "a/b"}, "CNI_IFNAME"),
        ({"CNI_IFNAME": ".."}, "CNI_IFNAME"),
        ({"CNI_IFNAME": "et h0"}, "CNI_IFNAME"),
        ({"CNI_ARGS": "K8S_POD_NAME"}, "CNI_ARGS"),
    ],
)
def test_bad_env_is_code_4_naming_the_variable(change, named) -> None:
    code, text = code_of(parse_env, {**GOOD, **change})
    assert code == 4 and named in text


def test_del_does_not_need_a_netns_and_status_needs_no_attachment() -> None:
    assert parse_env({**GOOD, "CNI_COMMAND": "DEL", "CNI_NETNS": ""}).netns == ""
    assert parse_env({"CNI_COMMAND": "STATUS"}).command == "STATUS"
    assert parse_env({"CNI_COMMAND": "GC", "CNI_PATH": "/x"}).path == ("/x",)


def test_cni_args_ignore_unknown_and_empty_pairs() -> None:
    assert parse_cni_args("A=1;;B=;IgnoreUnknown=true") == {
        "A": "1",
        "B": "",
        "IgnoreUnknown": "true",
    }


@pytest.mark.parametrize(
    "data,code,named",
    [
        (b"{not json", 6, "decode"),
        (b"[1, 2]", 6, "object"),
        (json.dumps({"cniVersion": 1, "name": "n"}), 6, "cniVersion"),
        (json.dumps({"cniVersion": "1.0", "name": "n"}), 6, "version"),
        (json.dumps({"cniVersion": "9.9.9", "name": "n"}), 1, "0.3.0"),
        (json.dumps({"cniVersion": "0.2.0", "name": "n"}), 1, "incompatible"),
        (json.dumps({"cniVersion": "1.0.0"}), 7, "name"),
        (json.dumps({"cniVersion": "1.0.0", "name": "a/b"}), 7, "name"),
    ],
)
def test_bad_config_codes(data, code, named) -> None:
    got, text = code_of(parse_config, data, "ADD")
    assert got == code and named in text


@pytest.mark.parametrize(
    "verb,version", [("CHECK", "0.3.1"), ("STATUS", "1.0.0"), ("GC", "0.4.0")]
)
def test_verb_needs_recent_version(verb, version) -> None:
    code, text = code_of(validate_version, version, verb)
    assert code == 1 and verb in text


def test_version_info_lists_supported() -> None:
    info = version_info("0.4.0")
    assert info["cniVersion"] == "0.4.0"
    assert info["supportedVersions"] == ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]


def test_gc_attachments_accept_both_keys_and_absent_means_none() -> None:
    conf = {
        "cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}],
        "cni.dev/attachments": [{"containerID": "b", "ifname": "net1"}],
    }
    assert gc_valid_attachments(conf) == {("a", "eth0"), ("b", "net1")}
    assert gc_valid_attachments({}) is None
    assert code_of(gc_valid_attachments, {"cni.dev/valid-attachments": "x"})[0] == 7


def test_error_json_round_trip() -> None:
    err = error_from_dict({"code": 11, "msg": "later", "details": "etcd down"})
    data = json.loads(err.to_json("1.0.0"))
    assert data == {"cniVersion": "1.0.0", "code": 11, "msg": "later", "details": "etcd down"}


@pytest.mark.parametrize(
    "stdin,plugin,expected",
    [
        (b'{"name":"n","daemonSocket": "/run/a.sock"}', "bridge", "/run/a.sock"),
        (
            b'{"name":"n","ipam":{"type":"pycni-ipam","daemonSocket":"/run/i.sock"}}',
            "ipam",
            "/run/i.sock",
        ),
        (
            b'{"daemonSocket":"/run/top.sock","ipam":{"daemonSocket":"/run/i.sock"}}',
            "ipam",
            "/run/i.sock",
        ),
        (
            b'{"daemonSocket":"/run/top.sock","ipam":{"daemonSocket":"/run/i.sock"}}',
            "bridge",
            "/run/top.sock",
        ),
        (b'{"daemonSocket":"/run/we\\\\ird.sock"}', "bridge", "/run/we\\ird.sock"),
        (b'{"name":"n"}', "bridge", "/env.sock"),
        (b'{"daemonSocket": 5}', "bridge", "/env.sock"),
    ],
)
def test_executable_finds_the_daemon_socket(stdin, plugin, expected) -> None:
    from cni.exe import socket_path

    assert socket_path(plugin, stdin, {"PYCNI_SOCKET": "/env.sock"}) == expected

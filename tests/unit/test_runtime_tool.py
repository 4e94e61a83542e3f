"""cnitool semantics of `pycni net`: environment, container ID, output and errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cni.runtime.errors import JoinedErrors, PluginFailed
from cni.runtime.invoke import PluginNotFound
from cni.runtime.tool import (
    container_id_for,
    describe_error,
    parse_cap_args,
    parse_tool_args,
    tool_env,
)
from cni.spec.errors import CNIError, InvalidConfig, TryAgainLater
from tests.fixtures.runtime import read_calls, write_conflist, write_recording_plugin

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sha512_prefix(text: str) -> str:
    """The digest by an independent tool (coreutils), not by the code under test."""
    out = subprocess.run(["sha512sum"], input=text.encode(), capture_output=True, check=True)
    return out.stdout.decode()[:20]


@pytest.mark.parametrize("path", ["/var/run/netns/pod1", "/run/netns/cni-1234-abcd"])
def test_container_id_is_cnitool_plus_first_10_bytes_of_sha512(path):
    assert container_id_for(path) == "cnitool-" + sha512_prefix(path)
    assert len(container_id_for(path)) == len("cnitool-") + 20


def test_container_id_uses_the_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert container_id_for("ns1") == "cnitool-" + sha512_prefix(str(tmp_path / "ns1"))


@pytest.mark.parametrize(
    "text,pairs",
    [
        ("", ()),
        ("A=1", (("A", "1"),)),
        ("IgnoreUnknown=1;K8S_POD_NAME=web", (("IgnoreUnknown", "1"), ("K8S_POD_NAME", "web"))),
    ],
)
def test_cni_args_pairs(text, pairs):
    assert parse_tool_args(text) == pairs


@pytest.mark.parametrize("text", ["A", "A=", "=1", "A=1;", "A=1;;B=2", "A=1=2", ";"])
def test_cni_args_every_pair_needs_a_key_and_a_value(text):
    with pytest.raises(CNIError) as err:
        parse_tool_args(text)
    assert err.value.code == 4 and "CNI_ARGS" in err.value.msg


def test_cap_args_must_be_a_json_object():
    assert parse_cap_args('{"portMappings": []}') == {"portMappings": []}
    assert parse_cap_args("") == {}
    for bad in ("{nope", "[1]"):
        with pytest.raises(CNIError) as err:
            parse_cap_args(bad)
        assert err.value.code == 6 and "CAP_ARGS" in err.value.msg


def test_tool_env_defaults_and_precedence():
    env = tool_env({})
    assert (env.conf_dir, env.ifname, env.path, env.cache_dir) == (
        "/etc/cni/net.d",
        "eth0",
        (),
        "/var/lib/cni",
    )
    env = tool_env(
        {"CNI_IFNAME": "net1", "CNI_PATH": "/a::/b", "NETCONFPATH": "/c", "CNI_CACHE_DIR": "/d"}
    )
    assert (env.ifname, env.path, env.conf_dir, env.cache_dir) == (
        "net1",
        ("/a", "/b"),
        "/c",
        "/d",
    )
    assert tool_env({"CNI_IFNAME": "net1"}, ifname="net2").ifname == "net2"


def test_describe_error_names_plugin_code_and_cleanup():
    cause = TryAgainLater("pycnid is not reachable at /run/pycni/pycnid.sock", "start it")
    text = describe_error(
        PluginFailed(cause, "pycni-bridge", "ADD", 0, 2), "add", "podnet", "/var/run/netns/p"
    )
    assert 'plugin "pycni-bridge" (plugin 1 of 2) failed (ADD)' in text
    assert "CNI error 11 (try again later): pycnid is not reachable" in text
    assert "details: start it" in text
    assert "pycni net del podnet /var/run/netns/p" in text


def test_describe_error_without_a_plugin_run_offers_no_cleanup():
    missing = PluginFailed(PluginNotFound("failed to find plugin"), "x", "ADD", 0, 1)
    assert "clean up" not in describe_error(missing, "add", "n", "/p")
    joined = JoinedErrors([InvalidConfig("one"), PluginFailed(CNIError("two"), "b", "GC")])
    text = describe_error(joined, "gc", "n", "/p")
    assert "CNI error 7 (invalid network config): one" in text and "two" in text


@pytest.fixture
def tool(tmp_path):
    bin_dir, log = str(tmp_path / "bin"), str(tmp_path / "calls.log")
    write_recording_plugin(bin_dir, "a", log)
    write_recording_plugin(
        bin_dir,
        "b",
        log,
        {
            "CHECK": {
                "exit": 1,
                "stdout": {"code": 100, "msg": "veth is gone", "details": "eth0 not found"},
            }
        },
    )
    write_conflist(
        tmp_path / "net.d",
        "10.conflist",
        {
            "cniVersion": "1.0.0",
            "name": "net",
            "plugins": [{"type": "a"}, {"type": "b", "capabilities": {"portMappings": True}}],
        },
    )

    def run(*args: str, **env: str) -> subprocess.CompletedProcess:
        environ = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": REPO,
            "CNI_PATH": bin_dir,
            "NETCONFPATH": str(tmp_path / "net.d"),
            "CNI_CACHE_DIR": str(tmp_path / "cache"),
            **env,
        }
        return subprocess.run(
            [sys.executable, "-m", "cli", "net", *args],
            env=environ,
            capture_output=True,
            text=True,
            timeout=60,
        )

    run.calls = lambda: read_calls(log)
    run.cache = tmp_path / "cache" / "results"
    return run


def test_cli_add_prints_the_result_indented_and_caches_it(tool):
    caps = '{"portMappings": [{"hostPort": 80, "containerPort": 8080}]}'
    proc = tool(
        "add",
        "net",
        "/var/run/netns/x",
        "-i",
        "net1",
        CAP_ARGS=caps,
        CNI_IFNAME="eth9",
        CNI_ARGS="K=V",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert proc.stdout.startswith('{\n    "cniVersion": "1.0.0"')
    assert [i["name"] for i in result["interfaces"]] == ["a", "b"]
    cid = container_id_for("/var/run/netns/x")
    env = tool.calls()[0]["env"]
    assert (env["CNI_CONTAINERID"], env["CNI_IFNAME"], env["CNI_ARGS"]) == (cid, "net1", "K=V")
    assert tool.calls()[1]["stdin"]["runtimeConfig"]["portMappings"][0]["hostPort"] == 80
    assert (tool.cache / f"net-{cid}-net1").exists()


def test_cli_del_prints_nothing_and_clears_the_cache(tool):
    assert tool("add", "net", "/var/run/netns/x").returncode == 0
    proc = tool("del", "net", "/var/run/netns/x")
    assert (proc.returncode, proc.stdout) == (0, "")
    assert list(tool.cache.iterdir()) == []


def test_cli_error_is_readable_with_exit_status_1(tool):
    assert tool("add", "net", "/var/run/netns/x").returncode == 0
    proc = tool("check", "net", "/var/run/netns/x")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert 'plugin "b" (plugin 2 of 2) failed (CHECK)' in proc.stderr
    assert "CNI error 100 (check failed): veth is gone" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_rejects_bad_cni_args_before_running_anything(tool):
    proc = tool("add", "net", "/var/run/netns/x", CNI_ARGS="novalue")
    assert proc.returncode == 1 and "invalid CNI_ARGS pair 'novalue'" in proc.stderr
    assert tool.calls() == []


def test_cli_unknown_network(tool):
    proc = tool("status", "nonet", "/var/run/netns/x")
    assert proc.returncode == 1 and 'no net configuration with name "nonet"' in proc.stderr


def test_pycni_group_discovers_command_modules_lazily():
    from click.testing import CliRunner

    from cli import cli, command_modules

    assert {"net", "daemon"} <= set(command_modules())
    out = CliRunner().invoke(cli, ["--help"])
    assert out.exit_code == 0 and "net" in out.output and "daemon" in out.output
    out = CliRunner().invoke(cli, ["net", "--help"])
    assert all(verb in out.output for verb in ("add", "check", "del", "gc", "status"))
    assert CliRunner().invoke(cli, ["nosuch"]).exit_code == 2

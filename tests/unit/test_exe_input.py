"""Bad input to the plugin executable: it exits promptly with one spec error JSON naming the
problem, never a traceback, never a hang: a runtime
must always get an answer it can parse.

Each case runs the real launcher as a runtime does (env + stdin, subprocess) with the daemon
socket unreachable: every check here happens before the executable talks to pycnid.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni.spec import envcheck
from tests.fixtures.plugins import PluginRun, run_plugin

CONF = {
    "cniVersion": "1.0.0",
    "name": "n",
    "type": "pycni-bridge",
    "ipam": {"type": "pycni-ipam", "ranges": [[{"subnet": "10.250.0.0/24"}]]},
}
NETNS = "/proc/self/ns/net"


@pytest.fixture
def run(cni_bin, tmp_path):
    """run(command, config, plugin=..., **run_plugin keywords) against an absent daemon."""

    def invoke(command: str, config=CONF, plugin: str = "bridge", **kw) -> PluginRun:
        kw.setdefault("container_id", "c1")
        kw.setdefault("netns", NETNS)
        out = run_plugin(
            f"{cni_bin}/pycni-{plugin}",
            command,
            config,
            cni_path="/nonexistent",
            socket=str(tmp_path / "absent.sock"),
            timeout=20,
            **kw,
        )
        assert "Traceback" not in out.stdout + out.stderr, out.stderr
        assert out.code != 0 and isinstance(out.json, dict), out.stdout
        return out

    return invoke


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("command", ["ADD", "DEL", "CHECK"])
def test_a_fifo_as_netns_is_code_4_without_blocking(run, tmp_path, command):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = run(command, netns=str(fifo))
    assert out.error_code() == 4 and "CNI_NETNS" in out.json["msg"]
    assert "FIFO" in out.json["details"]


def test_what_cannot_be_a_netns_is_code_4_naming_its_kind(run, tmp_path):
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    try:
        for path, kind in (
            (str(tmp_path), "directory"),
            (str(tmp_path / "sock"), "socket"),
            ("/dev/null", "device"),
        ):
            for command in ("ADD", "DEL"):
                out = run(command, netns=path)
                assert out.error_code() == 4 and "CNI_NETNS" in out.json["msg"], out.stdout
                assert kind in out.json["details"]
    finally:
        server.close()


def test_deep_nesting_while_looking_for_daemon_socket_is_one_json(run):
    # the escape makes the quick scan give up, so the config is parsed: RecursionError once
    stdin = (
        '{"cniVersion": "1.0.0", "name": "n", "type": "t", "daemonSocket": "\\u002f", '
        f'"x": {deep(100_000)}}}'
    )
    for command in ("ADD", "DEL", "CHECK"):
        assert run(command, stdin).error_code() == 6


def test_deep_nesting_with_the_daemon_unreachable_is_one_json(run):
    stdin = f'{{"cniVersion": "1.0.0", "name": "n", "type": "t", "ipam": {deep(100_000)}}}'
    assert run("ADD", stdin).error_code() == 6
    assert run("DEL", stdin).error_code() == 6


@pytest.mark.parametrize(
    "variable", ["CNI_ARGS", "CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS", "CNI_PATH", "CNI_EXTRA"]
)
def test_a_non_utf8_byte_in_a_cni_variable_is_code_4_naming_it(run, variable):
    # os.environ holds the byte 0xff as the surrogate escape U+DCFF (subprocess re-encodes it)
    out = run("ADD", extra_env={variable: "ok\udcff"})
    assert out.error_code() == 4 and variable in out.json["msg"], out.stdout
    assert "UTF-8" in out.json["details"]


def test_a_non_utf8_variable_name_is_code_4(run):
    out = run("DEL", extra_env={"CNI_\udcff": "1"})
    assert out.error_code() == 4 and "CNI_" in out.json["msg"]


@pytest.mark.parametrize("value", ["abc", "nan", "inf", "-inf", "-1", "0", "1e300", "\udcff"])
def test_a_bad_pycni_timeout_is_code_4_naming_it(run, value):
    out = run("ADD", extra_env={"PYCNI_TIMEOUT": value})
    assert out.error_code() == 4 and "PYCNI_TIMEOUT" in out.json["msg"], out.stdout


def test_a_good_pycni_timeout_reaches_the_daemon(run):
    out = run("ADD", extra_env={"PYCNI_TIMEOUT": "0.5"})
    assert out.error_code() == 11 and "absent.sock" in out.json["msg"]


def test_a_lone_surrogate_in_daemon_socket_is_code_7_naming_the_key(run):
    out = run("ADD", json.dumps({**CONF, "daemonSocket": "\ud800"}))
    assert out.error_code() == 7 and "'daemonSocket'" in out.json["msg"]
    ipam = {**CONF, "ipam": {"type": "pycni-ipam", "daemonSocket": "\ud800"}}
    out = run("ADD", json.dumps(ipam), plugin="ipam")
    assert out.error_code() == 7 and "'ipam.daemonSocket'" in out.json["msg"]


def test_an_ifname_of_16_utf8_bytes_is_code_4(run):
    out = run("ADD", ifname="ü" * 8)
    assert out.error_code() == 4 and "CNI_IFNAME" in out.json["msg"]
    assert "16 bytes" in out.json["details"]
    assert run("ADD", ifname="ü" * 7).error_code() == 11  # 14 bytes fit: on to the daemon


def test_an_add_over_the_request_limit_is_code_7_naming_size_and_limit(run):
    from cni.spec.wire import MAX_REQUEST

    out = run("ADD", json.dumps({**CONF, "x": "y" * MAX_REQUEST}))
    assert out.error_code() == 7, out.stdout
    assert str(MAX_REQUEST) in out.json["msg"] and "bytes" in out.json["msg"]


def test_an_unexpected_exception_still_prints_one_json_error():
    """The last-resort guard in main: a bug (here forced by replacing run) is 999, exit 1."""
    code = (
        "import cni.exe as exe\n"
        "def broken(*args):\n    raise KeyError('forced')\n"
        "exe.run = broken\nexe.main('bridge')\n"
    )
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c1",
        "CNI_IFNAME": "eth0",
        "CNI_NETNS": NETNS,
        "PATH": "/usr/bin:/bin",
    }
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=b"{}",
        capture_output=True,
        timeout=20,
        env={**env, "PYTHONPATH": root},
    )
    reply = json.loads(proc.stdout)
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr
    assert reply["code"] == 999 and "KeyError" in reply["details"]


# envcheck on generated environments: an answer, never an exception

ENV_TEXT = st.text(
    st.characters(codec="utf-8") | st.sampled_from("\udcff\udc80üé/:. "), max_size=20
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "CNI_COMMAND",
                "CNI_CONTAINERID",
                "CNI_NETNS",
                "CNI_IFNAME",
                "CNI_ARGS",
                "CNI_PATH",
                "CNI_\udcff",
            ]
        ),
        ENV_TEXT,
    ),
    st.sampled_from(envcheck.COMMANDS),
)
def test_check_env_answers_every_environment(environ, command):
    environ = {"CNI_COMMAND": command, **environ}
    problem = envcheck.check_env(environ)
    assert problem is None or (problem[0] == 4 and isinstance(problem[1], str))
    if problem is None and command in envcheck.ATTACHMENT_VERBS:
        assert all(envcheck.is_utf8(k) and envcheck.is_utf8(v) for k, v in environ.items())
        assert 0 < len(environ["CNI_IFNAME"].encode()) <= 15


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=24))
def test_check_ifname_counts_utf8_bytes(name):
    problem = envcheck.check_ifname(name)
    if len(name.encode("utf-8", "surrogatepass")) > 15:
        assert problem is not None and problem[0] == 4

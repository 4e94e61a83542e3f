"""pycnid as a process: socket safety, unreachable/slow daemon, bad netns, clean shutdown."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

from tests.fixtures.daemon import daemon_config
from tests.fixtures.plugins import run_plugin

CONF = {"cniVersion": "1.0.0", "name": "testnet", "type": "pycni-bridge"}


def test_socket_is_root_only(pycnid) -> None:
    mode = os.stat(pycnid.socket).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


def test_unreachable_daemon_is_code_11_naming_the_socket(cni_bin, netns_factory) -> None:
    pod = netns_factory("pod")
    path = os.path.join(tempfile.mkdtemp(), "absent.sock")
    started = time.monotonic()
    out = run_plugin(
        f"{cni_bin}/pycni-bridge", "ADD", CONF, container_id="c1", netns=pod.path, socket=path
    )
    assert time.monotonic() - started < 5
    assert out.code != 0 and out.error_code() == 11
    assert path in out.json["msg"] and "pycnid" in out.json["details"]


def test_daemon_that_never_answers_times_out_with_code_11(cni_bin, netns_factory) -> None:
    pod = netns_factory("pod")
    path = os.path.join(tempfile.mkdtemp(), "silent.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(4)
    held = []
    threading.Thread(target=lambda: held.append(server.accept()), daemon=True).start()
    try:
        started = time.monotonic()
        out = run_plugin(
            f"{cni_bin}/pycni-bridge",
            "ADD",
            CONF,
            container_id="c1",
            netns=pod.path,
            socket=path,
            extra_env={"PYCNI_TIMEOUT": "1.5"},
        )
        elapsed = time.monotonic() - started
    finally:
        server.close()
        for conn, _addr in held:
            conn.close()
    assert out.error_code() == 11 and "did not answer" in out.json["msg"]
    assert 1.4 < elapsed < 5


def test_config_error_outranks_unreachable_daemon(cni_bin, netns_factory) -> None:
    pod = netns_factory("pod")
    out = run_plugin(
        f"{cni_bin}/pycni-bridge",
        "ADD",
        b"{broken",
        container_id="c1",
        netns=pod.path,
        socket="/nonexistent/pycnid.sock",
    )
    assert out.error_code() == 6


def test_missing_netns_is_code_3_and_never_created(cni_bin, pycnid) -> None:
    path = "/var/run/netns/pycni-test-does-not-exist"
    out = run_plugin(
        f"{cni_bin}/pycni-bridge", "ADD", CONF, container_id="c1", netns=path, socket=pycnid.socket
    )
    assert out.error_code() == 3 and path in out.json["details"]
    assert not os.path.exists(path)


def test_a_file_that_is_not_a_netns_is_refused(cni_bin, pycnid) -> None:
    with tempfile.NamedTemporaryFile() as fake:
        out = run_plugin(
            f"{cni_bin}/pycni-bridge",
            "ADD",
            CONF,
            container_id="c1",
            netns=fake.name,
            socket=pycnid.socket,
        )
    assert out.code != 0 and out.error_code() == 4
    assert "CNI_NETNS" in out.json["msg"]


def test_unknown_plugin_is_a_config_error(pycnid) -> None:
    code = "from cni.exe import main; main('nope')"
    env = {"CNI_COMMAND": "STATUS", "PYCNI_SOCKET": pycnid.socket, "CNI_PATH": "/x"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(CONF | {"cniVersion": "1.1.0"}).encode(),
        env=env,
        capture_output=True,
    )
    err = json.loads(proc.stdout)
    assert proc.returncode == 1 and err["code"] == 7 and "'nope'" in err["msg"]


def test_bad_input_never_gives_a_traceback(cni_bin, pycnid, netns_factory) -> None:
    pod = netns_factory("pod")
    for stdin in (b"", b"null", b"\xff\xfe", json.dumps({"cniVersion": "1.0.0"}).encode()):
        out = run_plugin(
            f"{cni_bin}/pycni-bridge",
            "ADD",
            stdin,
            container_id="c1",
            netns=pod.path,
            socket=pycnid.socket,
        )
        assert out.code != 0 and out.error_code() in (6, 7), out.stdout
        assert "Traceback" not in out.stdout + out.stderr


def test_sigterm_stops_cleanly_and_removes_the_socket(pycnid) -> None:
    assert pycnid.stop() == 0
    assert not os.path.exists(pycnid.socket)
    assert '"pycnid stopped"' in pycnid.log()


def test_logs_are_json_lines(cni_bin, pycnid, netns_factory) -> None:
    pod = netns_factory("pod")
    run_plugin(
        f"{cni_bin}/pycni-bridge",
        "ADD",
        {"cniVersion": "1.0.0", "name": "n", "type": "x", "ipam": "bad"},
        container_id="c1",
        netns=pod.path,
        socket=pycnid.socket,
    )
    pycnid.stop()
    lines = [json.loads(line) for line in pycnid.log().splitlines() if line.strip()]
    assert lines and all({"ts", "level", "msg"} <= set(line) for line in lines)
    assert any(line.get("command") == "ADD" and line.get("containerID") == "c1" for line in lines)


def test_second_daemon_on_the_same_socket_refuses_to_start(pycnid, tmp_path) -> None:
    """In the node netns with a state dir of its own (never the machine's /var/lib/pycni)."""
    config = tmp_path / "second.json"
    config.write_text(json.dumps({**daemon_config(str(tmp_path)), "socket": pycnid.socket}))
    proc = pycnid.node.run(
        [sys.executable, "-m", "pycnid.main", "--config", str(config)],
        check=False,
        timeout=30,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    assert proc.returncode != 0 and "already serving" in proc.stderr
    assert os.path.exists(pycnid.socket)

"""pycnid's socket transport against a real daemon: the request size limit (answered, never
dropped, no fd kept), DEL over the limit, idle connections, the socket path: a
client that sends too much or nothing at all is answered or closed, and the others are served."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

from cni import exe
from cni.spec import wire
from tests.fixtures.bridge import bridge_conf, ipam_handles, node_veths, pycni_ipam
from tests.fixtures.daemon import Pycnid, daemon_config, send_frame
from tests.fixtures.plugins import run_plugin
from tests.fixtures.waiting import wait_for

CONF = bridge_conf(pycni_ipam("10.31.0.0/24"), name="bignet")
OVER = wire.MAX_REQUEST + 1024


def fds_on(daemon: Pycnid, netns_path: str) -> int:
    """How many of pycnid's open fds refer to that network namespace."""
    ns = os.stat(netns_path)
    fd_dir = f"/proc/{daemon.proc.pid}/fd"
    count = 0
    for name in os.listdir(fd_dir):
        try:
            st = os.stat(f"{fd_dir}/{name}")
        except OSError:
            continue  # closed meanwhile
        count += (st.st_dev, st.st_ino) == (ns.st_dev, ns.st_ino)
    return count


def none_kept(daemon: Pycnid, netns_path: str) -> None:
    """pycnid holds no fd of that netns (a worker closes it just after its reply)."""
    wait_for(f"pycnid to close its fds of {netns_path}", lambda: fds_on(daemon, netns_path) == 0)


def raw_request(path: str, request: bytes, netns_fd: int | None = None) -> bytes:
    return send_frame(path, request, () if netns_fd is None else (netns_fd,))


def big_request(command: str, size: int = OVER) -> bytes:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c-big", "CNI_IFNAME": "eth0"}
    return wire.encode_request("bridge", env, json.dumps({**CONF, "x": "y" * size}).encode(), True)


def assert_too_large(reply: bytes, size: int) -> None:
    code, stdout = wire.decode_reply(reply)
    err = json.loads(stdout)
    assert code == 1 and err["code"] == 7, stdout
    assert str(size) in err["msg"] and str(wire.MAX_REQUEST) in err["msg"]


def test_an_oversized_request_is_answered_and_its_fd_closed(pycnid, netns_factory):
    pod = netns_factory("pod")
    netns_fd = os.open(pod.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for command in ("ADD", "DEL") * 5:
            request = big_request(command)
            assert_too_large(raw_request(pycnid.socket, request, netns_fd), len(request))
    finally:
        os.close(netns_fd)
    none_kept(pycnid, pod.path)
    assert "Traceback" not in pycnid.log() and "refused request" in pycnid.log()


def test_the_executable_reads_the_refusal_after_its_send_fails(pycnid):
    """exe.exchange straight at pycnid (no size check first): the reply, not code 11."""
    request = big_request("ADD", 8 * wire.MAX_REQUEST)
    code, stdout = exe.exchange(pycnid.socket, request, None, 20)
    assert code == 1 and json.loads(stdout)["code"] == 7


def test_an_add_over_the_limit_is_code_7_from_the_executable(cni_bin, pycnid, netns_factory):
    pod = netns_factory("pod")
    out = run_plugin(
        f"{cni_bin}/pycni-bridge",
        "ADD",
        {**CONF, "x": "y" * OVER},
        container_id="c1",
        netns=pod.path,
        socket=pycnid.socket,
    )
    assert out.code == 1 and out.error_code() == 7, out.stdout
    assert str(wire.MAX_REQUEST) in out.json["msg"]
    assert node_veths(pycnid.node, "bignet") == []


@pytest.mark.parametrize("bulk", ["prevResult", "runtimeConfig", "x", "ipam"])
def test_a_del_over_the_limit_still_releases_the_attachment(
    cni_bin, cni_path, pycnid, netns_factory, bulk
):
    pod = netns_factory("pod")
    run = lambda command, conf: run_plugin(  # noqa: E731
        f"{cni_bin}/pycni-bridge",
        command,
        conf,
        container_id="c-del",
        netns=pod.path,
        cni_path=cni_path,
        socket=pycnid.socket,
    )
    added = run("ADD", CONF)
    assert added.ok, added.stdout
    assert ipam_handles(pycnid.config["store"]["path"], "bignet") != []
    padding = "y" * OVER
    conf = (
        {**CONF, "ipam": {**CONF["ipam"], "x": padding}}
        if bulk == "ipam"
        else {**CONF, bulk: {"padding": padding}}
    )
    deleted = run("DEL", conf)
    assert deleted.ok and deleted.stdout.strip() == "", deleted.stdout
    assert node_veths(pycnid.node, "bignet") == []
    assert ipam_handles(pycnid.config["store"]["path"], "bignet") == []  # the lease released


def test_an_idle_client_is_closed_and_others_are_served(cni_bin, node, netns_factory):
    workdir = tempfile.mkdtemp(prefix="pycnid-")
    daemon = Pycnid(
        node=node, workdir=workdir, config=daemon_config(workdir, workers=1, receiveTimeout=1)
    )
    daemon.start()
    pod, held = netns_factory("pod"), netns_factory("pod")
    try:
        with socket.socket(socket.AF_UNIX) as idle, socket.socket(socket.AF_UNIX) as partial:
            idle.settimeout(30)
            partial.settimeout(30)
            idle.connect(daemon.socket)
            partial.connect(daemon.socket)
            netns_fd = os.open(held.path, os.O_RDONLY | os.O_CLOEXEC)
            try:  # a header that never ends, with a netns fd
                partial.sendmsg(
                    [b"PYCNI1 bridge 10 "],
                    [(socket.SOL_SOCKET, socket.SCM_RIGHTS, netns_fd.to_bytes(4, sys.byteorder))],
                )
            finally:
                os.close(netns_fd)
            served = run_plugin(
                f"{cni_bin}/pycni-bridge",
                "DEL",
                CONF,
                container_id="c2",
                netns=pod.path,
                socket=daemon.socket,
            )
            assert served.ok, served.stdout
            assert idle.recv(100) == b"" and partial.recv(100) == b""  # closed by pycnid
        none_kept(daemon, held.path)
    finally:
        daemon.stop()
    log = daemon.log()
    shutil.rmtree(workdir, ignore_errors=True)
    assert log.count("idle connection closed") == 2 and "Traceback" not in log


def start_on(node, workdir: str, socket_path: str) -> subprocess.CompletedProcess:
    cfg = os.path.join(workdir, "pycnid.json")
    with open(cfg, "w") as fh:
        json.dump(daemon_config(workdir) | {"socket": socket_path}, fh)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.run(
        ["ip", "netns", "exec", node.name, sys.executable, "-m", "pycnid.main", "--config", cfg],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": root},
    )


@pytest.mark.parametrize("kind", ["file", "directory", "symlink"])
def test_a_socket_path_that_is_not_a_socket_is_refused_and_kept(node, tmp_path, kind):
    path = tmp_path / "pycnid.sock"
    if kind == "file":
        path.write_text("precious")
    elif kind == "directory":
        path.mkdir()
    else:
        (tmp_path / "target").write_text("precious")
        path.symlink_to(tmp_path / "target")
    proc = start_on(node, str(tmp_path), str(path))
    assert proc.returncode == 1 and str(path) in proc.stderr and "not a socket" in proc.stderr
    assert "Traceback" not in proc.stderr
    if kind == "file":
        assert path.read_text() == "precious"
    assert os.path.lexists(path)


def test_a_stale_socket_is_replaced(node, tmp_path):
    path = str(tmp_path / "pycnid.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()  # the file stays, nobody listens
    daemon = Pycnid(
        node=node, workdir=str(tmp_path), config=daemon_config(str(tmp_path)) | {"socket": path}
    )
    daemon.start()
    try:
        with socket.socket(socket.AF_UNIX) as probe:
            probe.connect(path)
    finally:
        daemon.stop()


@pytest.mark.parametrize(
    "frame", [b"PYCNI2 bridge 0 0 0\n", b"GET / HTTP/1.1\r\n\r\n", b"PYCNI1 bridge 5 0 0\nabc"]
)
def test_a_frame_of_another_protocol_is_answered_code_6(pycnid, frame):
    """An executable of another pycni version (or any other client) learns why, instead of
    a silent close that the executable reports as 11 (retried for ever)."""
    code, stdout = wire.decode_reply(raw_request(pycnid.socket, frame))
    err = json.loads(stdout)
    assert code == 1 and err["code"] == 6 and "malformed request" in err["msg"]
    assert "Traceback" not in pycnid.log()


def test_a_plugin_name_that_is_not_utf8_is_answered(pycnid):
    env = {"CNI_COMMAND": "STATUS"}
    frame = wire.encode_request("bridge", env, json.dumps(CONF).encode(), False)
    frame = frame.replace(b" bridge ", b" br\xffdge ", 1)
    code, stdout = wire.decode_reply(raw_request(pycnid.socket, frame))
    assert code == 1 and json.loads(stdout)["code"] == 7 and "serves no plugin" in stdout

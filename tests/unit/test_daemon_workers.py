"""pycnid's transport: a fixed pool of worker threads fed by the accept loop, over a real unix
socket (peer credentials, SCM_RIGHTS), plus the ``workers`` config key."""

from __future__ import annotations

import array
import os
import socket
import tempfile
import threading

import pytest

from cni.spec import wire
from cni.spec.errors import InvalidConfig
from pycnid.config import parse_daemon_config
from pycnid.server import PluginServer
from pycnid.workers import WorkerPool
from tests.fixtures.waiting import wait_for


def test_pool_reuses_its_threads() -> None:
    seen: list[str] = []
    done = threading.Semaphore(0)

    def run(_task: int) -> None:
        seen.append(threading.current_thread().name)
        done.release()

    pool: WorkerPool[int] = WorkerPool(2, run, lambda _t: None, name="t")
    try:
        wait_for("the condition", lambda: pool._idle == 2, 5.0, step=0.005)
        for i in range(50):
            pool.submit(i)
            assert done.acquire(timeout=5)
        assert set(seen) <= {"t-0", "t-1"} and len(seen) == 50
        assert pool.overflow_count == 0
    finally:
        pool.stop()


def test_a_busy_pool_gives_a_request_a_thread_of_its_own() -> None:
    """Requests may wait for each other (same attachment, GC): none waits for a free worker."""
    release = threading.Event()
    finished: list[int] = []

    def run(task: int) -> None:
        if task < 2:
            release.wait(5)  # both workers blocked on what task 2 will do
        else:
            release.set()
        finished.append(task)

    pool: WorkerPool[int] = WorkerPool(2, run, lambda _t: None)
    try:
        wait_for("the condition", lambda: pool._idle == 2, 5.0, step=0.005)
        for task in range(3):
            pool.submit(task)
        wait_for("the condition", lambda: len(finished) == 3, 5.0, step=0.005)
        assert finished[0] == 2 and pool.overflow_count == 1
    finally:
        pool.stop()


def test_stop_drops_queued_tasks_and_ends_the_workers() -> None:
    dropped: list[int] = []
    pool: WorkerPool[int] = WorkerPool(1, lambda _t: None, dropped.append)
    pool.stop()
    pool.submit(7)
    assert dropped == [7]
    assert not any(t.is_alive() for t in pool._threads)


def test_workers_key_is_validated() -> None:
    assert parse_daemon_config({}).workers == 16
    assert parse_daemon_config({"workers": 4}).workers == 4
    for value in (0, -1, "8", True, 2.5, 5000):
        with pytest.raises(InvalidConfig, match="workers"):
            parse_daemon_config({"workers": value})


@pytest.fixture
def server():
    """A PluginServer on a temp socket whose serve() answers with what it received."""
    directory = tempfile.mkdtemp(prefix="pycni-workers-")
    path = os.path.join(directory, "d.sock")
    calls: list[tuple[str, str]] = []

    def serve(plugin: str, env: dict, stdin: bytes, fd: int | None) -> tuple[int, str]:
        calls.append((threading.current_thread().name, env["CNI_COMMAND"]))
        kind = os.readlink(f"/proc/self/fd/{fd}") if fd is not None else "none"
        return 0, f"{plugin} {stdin.decode()} {kind}"

    srv = PluginServer(path, serve, workers=3)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        # the workers count themselves idle once they run: a request before that goes to a
        # thread of its own (served alike), which the tests below count as an overflow
        wait_for("the workers idle", lambda: srv.pool._idle == srv.pool.size, step=0.01)
        yield srv, calls
    finally:
        srv.shutdown()
        thread.join(5)
        srv.server_close()
        os.rmdir(directory)


def call(path: str, stdin: bytes, fd: int | None = None) -> tuple[int, str]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        data = wire.encode_request("ipam", {"CNI_COMMAND": "ADD"}, stdin, fd is not None)
        ancillary = (
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())]
            if fd is not None
            else []
        )
        sock.sendmsg([data], ancillary)
        sock.shutdown(socket.SHUT_WR)
        reply = b"".join(iter(lambda: sock.recv(65536), b""))
    return wire.decode_reply(reply)


def test_server_serves_on_pooled_threads_with_the_fd(server) -> None:
    srv, calls = server
    netns = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        for i in range(20):
            code, out = call(srv.path, f"req{i}".encode(), netns if i % 2 else None)
            assert code == 0
            assert out == (
                f"ipam req{i} net:[{os.fstat(netns).st_ino}]" if i % 2 else f"ipam req{i} none"
            )
    finally:
        os.close(netns)
    assert {name for name, _ in calls} <= {f"pycnid-worker-{i}" for i in range(3)}
    assert srv.pool.overflow_count == 0
    assert oct(os.stat(srv.path).st_mode & 0o777) == "0o600"


def test_server_close_removes_the_socket_and_stops_the_workers(server) -> None:
    srv, _calls = server
    assert call(srv.path, b"x")[0] == 0
    srv.shutdown()
    srv.server_close()
    assert not os.path.exists(srv.path)
    assert not any(t.is_alive() for t in srv.pool._threads)

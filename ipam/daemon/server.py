"""The unix-socket transport of pycnid: root-only socket, peer credentials, a pool of workers.

The accept loop (``serve_forever``) hands each connection to a ``WorkerPool`` of long-lived
threads (``workers`` in the daemon config); a connection is served whole by one worker.
"""
from __future__ import annotations

import array
import logging
import os
import socket
import socketserver
import struct
from typing import Callable

from cni.spec import wire

from .config import DEFAULT_WORKERS
from .workers import WorkerPool

log = logging.getLogger("pycnid.server")

MAX_REQUEST = 4 << 20
SO_PEERCRED_FMT = "3i"


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(SO_PEERCRED_FMT))
    _pid, uid, _gid = struct.unpack(SO_PEERCRED_FMT, creds)
    return uid


def receive_request(sock: socket.socket) -> tuple[bytes, int | None]:
    """Read the whole request (until the peer shuts its write side) and the fd it carried."""
    fds = array.array("i")
    data, ancdata, _flags, _addr = sock.recvmsg(65536, socket.CMSG_SPACE(fds.itemsize * 4))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    chunks = [data]
    total = len(data)
    while data:
        data = sock.recv(65536)
        chunks.append(data)
        total += len(data)
        if total > MAX_REQUEST:
            raise ValueError("request too large")
    for extra in list(fds)[1:]:
        os.close(extra)
    return b"".join(chunks), (fds[0] if fds else None)


def serve_connection(sock: socket.socket,
                     serve: Callable[[str, dict, bytes, int | None], tuple[int, str]]) -> None:
    """One request on an accepted connection: check the peer, read, serve, reply."""
    fd = None
    try:
        uid = peer_uid(sock)
        if uid not in (0, os.getuid()):
            log.warning("refused request from uid %d", uid)
            return
        raw, fd = receive_request(sock)
        plugin, env, stdin, _has_fd = wire.decode_request(raw)
        exit_code, stdout = serve(plugin, env, stdin, fd)
        sock.sendall(wire.encode_reply(exit_code, stdout))
    except (OSError, ValueError) as exc:
        log.warning("bad request: %s", exc)
    finally:
        if fd is not None:
            os.close(fd)


class PluginServer(socketserver.UnixStreamServer):
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, path: str, serve: Callable[[str, dict, bytes, int | None], tuple[int, str]],
                 workers: int = DEFAULT_WORKERS) -> None:
        self.path = path
        self.serve = serve
        prepare_socket_path(path)
        # the workers first: the socket appearing means pycnid is ready (and may be stopped)
        self.pool: WorkerPool[socket.socket] = WorkerPool(workers, self._serve_one,
                                                          self.shutdown_request)
        old = os.umask(0o177)
        try:
            super().__init__(path, socketserver.BaseRequestHandler)
        except BaseException:
            self.pool.stop()
            raise
        finally:
            os.umask(old)
        os.chmod(path, 0o600)

    def process_request(self, request: socket.socket, client_address: object) -> None:
        self.pool.submit(request)  # the worker closes it

    def _serve_one(self, sock: socket.socket) -> None:
        try:
            serve_connection(sock, self.serve)
        finally:
            self.shutdown_request(sock)

    def server_close(self) -> None:
        super().server_close()
        self.pool.stop()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def prepare_socket_path(path: str) -> None:
    """Make the socket's directory (0700 when we create it) and clear a stale socket."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)
        else:
            raise RuntimeError(f"another pycnid is already serving {path}")
        finally:
            probe.close()

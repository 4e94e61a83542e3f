"""The unix-socket transport of pycnid: root-only socket, peer credentials, a pool of workers.

The accept loop (``serve_forever``) hands each connection to a ``WorkerPool`` of long-lived
threads (``workers`` in the daemon config); a connection is served whole by one worker.
A request must arrive whole within ``receiveTimeout`` seconds and be at most
``wire.MAX_REQUEST`` bytes (answered with an error, never dropped); whatever goes wrong, the
netns fd it carried is closed.
"""

from __future__ import annotations

import array
import logging
import os
import socket
import socketserver
import stat
import struct
import time
from collections.abc import Callable

from cni.spec import wire
from cni.spec.errors import BY_CODE, DecodingFailure
from pycnid.config import DEFAULT_RECEIVE_TIMEOUT, DEFAULT_WORKERS
from pycnid.workers import WorkerPool

log = logging.getLogger("pycnid.server")

SO_PEERCRED_FMT = "3i"


class RequestTooLarge(Exception):
    """The header announces more than wire.MAX_REQUEST bytes: answered, not read."""

    def __init__(self, size: int) -> None:
        super().__init__(f"{size} bytes")
        self.size = size


class RequestTimeout(Exception):
    """The request did not arrive whole in time."""


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(
        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(SO_PEERCRED_FMT)
    )
    _pid, uid, _gid = struct.unpack(SO_PEERCRED_FMT, creds)
    return uid


class Deadline:
    """Every read of one request shares one time budget."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self.sock, self.seconds = sock, seconds
        self.end = time.monotonic() + seconds

    def arm(self) -> None:
        left = self.end - time.monotonic()
        if left <= 0:
            raise RequestTimeout(f"the request did not arrive within {self.seconds:g}s")
        self.sock.settimeout(left)

    def recv(self, size: int) -> bytes:
        self.arm()
        try:
            return self.sock.recv(size)
        except TimeoutError:
            raise RequestTimeout(f"the request did not arrive within {self.seconds:g}s") from None


def receive_first(deadline: Deadline) -> tuple[bytes, int | None]:
    """The first chunk and the fd it carried (any further fds are closed at once)."""
    fds = array.array("i")
    deadline.arm()
    try:
        data, ancdata, _flags, _addr = deadline.sock.recvmsg(
            65536, socket.CMSG_SPACE(fds.itemsize * 4)
        )
    except TimeoutError:
        raise RequestTimeout(f"the request did not arrive within {deadline.seconds:g}s") from None
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    for extra in list(fds)[1:]:
        os.close(extra)
    return data, (fds[0] if fds else None)


def receive_request(
    sock: socket.socket, timeout: float = DEFAULT_RECEIVE_TIMEOUT
) -> tuple[bytes, int | None]:
    """Read the whole request (until the peer shuts its write side) and the fd it carried.
    The header's lengths are checked first: RequestTooLarge before the body is read."""
    deadline = Deadline(sock, timeout)
    data, fd = receive_first(deadline)
    try:
        return read_body(deadline, data), fd
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise


def read_head(deadline: Deadline, data: bytes) -> tuple[bytes, int | None]:
    """(what was read, the size the header announces), None if it closed before one."""
    size = wire.request_size(data)
    while size is None:
        chunk = deadline.recv(wire.MAX_HEAD)
        if not chunk:
            return data, None
        data += chunk
        size = wire.request_size(data)
    return data, size


def read_body(deadline: Deadline, data: bytes) -> bytes:
    data, size = read_head(deadline, data)
    if size is None:
        return data  # nothing (a probe), or a cut header that decode_request reports
    if size > wire.MAX_REQUEST:
        raise RequestTooLarge(size)
    chunks, total = [data], len(data)
    while total <= size:
        chunk = deadline.recv(min(65536, size + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > size:
        raise ValueError(f"request longer than its header's {size} bytes")
    return b"".join(chunks)


def serve_connection(
    sock: socket.socket,
    serve: Callable[[str, dict, bytes, int | None], tuple[int, str]],
    timeout: float = DEFAULT_RECEIVE_TIMEOUT,
) -> None:
    """One request on an accepted connection: check the peer, read, serve, reply."""
    fd = None
    try:
        uid = peer_uid(sock)
        if uid not in (0, os.getuid()):
            log.warning("refused request from uid %d", uid)
            return
        raw, fd = receive_request(sock, timeout)
        if not raw:
            log.debug("connection closed before a request (a liveness probe?)")
            return
        plugin, env, stdin, _has_fd = wire.decode_request(raw)
        exit_code, stdout = serve(plugin, env, stdin, fd)
        sock.settimeout(timeout)
        sock.sendall(wire.encode_reply(exit_code, stdout))
    except RequestTooLarge as exc:
        refuse_too_large(sock, exc.size, timeout)
    except RequestTimeout as exc:
        log.warning("idle connection closed: %s", exc)
    except OSError as exc:
        log.warning("bad request: %s", exc)
    except ValueError as exc:  # not our framing (another client, or an executable of
        log.warning("bad request: %s", exc)  # another pycni version): say so, then close
        refuse_malformed(sock, str(exc), timeout)
    finally:
        if fd is not None:
            os.close(fd)


def refuse_too_large(sock: socket.socket, size: int, timeout: float) -> None:
    """Answer instead of closing mid-send: the executable reads this reply after its EPIPE."""
    code, msg, details = wire.too_large(size)
    log.warning("refused request: %s", msg)
    sock.settimeout(timeout)
    try:
        sock.sendall(wire.encode_reply(1, BY_CODE[code](msg, details).to_json()))
    except OSError as exc:
        log.warning("could not answer the refused request: %s", exc)


def refuse_malformed(sock: socket.socket, why: str, timeout: float) -> None:
    err = DecodingFailure(
        "malformed request to pycnid",
        f"{why}; the executable and pycnid may be of different pycni versions",
    )
    sock.settimeout(timeout)
    try:
        sock.sendall(wire.encode_reply(1, err.to_json()))
    except OSError:
        pass  # the peer is gone; the warning above says what it sent


class PluginServer(socketserver.UnixStreamServer):
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(
        self,
        path: str,
        serve: Callable[[str, dict, bytes, int | None], tuple[int, str]],
        workers: int = DEFAULT_WORKERS,
        receive_timeout: float = DEFAULT_RECEIVE_TIMEOUT,
    ) -> None:
        self.path = path
        self.serve = serve
        self.receive_timeout = receive_timeout
        prepare_socket_path(path)
        # the workers first: the socket appearing means pycnid is ready (and may be stopped)
        self.pool: WorkerPool[socket.socket] = WorkerPool(
            workers, self._serve_one, self.shutdown_request
        )
        old = os.umask(0o177)
        try:
            super().__init__(path, socketserver.BaseRequestHandler)
        except BaseException:
            self.pool.stop()
            raise
        finally:
            os.umask(old)
        os.chmod(path, 0o600)

    def process_request(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: object
    ) -> None:
        assert isinstance(request, socket.socket)  # a stream server's request is its connection
        self.pool.submit(request)  # the worker closes it

    def _serve_one(self, sock: socket.socket) -> None:
        try:
            serve_connection(sock, self.serve, self.receive_timeout)
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
    """Make the socket's directory (0700 when we create it) and clear a stale socket: only a
    socket nobody answers on is removed; any other file at `path` is refused (RuntimeError)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise RuntimeError(
            f"socket path {path} exists and is not a socket: "
            "refusing to remove it (point 'socket' elsewhere or remove it)"
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)  # stale: left by a pycnid that did not stop cleanly
    except OSError as exc:
        raise RuntimeError(f"cannot tell whether a pycnid serves {path}: {exc}") from None
    else:
        raise RuntimeError(f"another pycnid is already serving {path}")
    finally:
        probe.close()

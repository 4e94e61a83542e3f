"""The thin plugin executable: CNI env + stdin (+ the netns fd) -> pycnid -> stdout.

Builtins only on the fast path (a test asserts no third-party module is loaded, and the
VERSION benchmark holds it to 2x a bare interpreter). It checks the environment, answers
VERSION itself, opens CNI_NETNS (a missing netns is an error, never created), hands the raw
request to the node daemon over its unix socket with the netns fd attached (SCM_RIGHTS), and
prints the reply. If the daemon is unreachable it answers code 11 naming the socket, within a
hard timeout. Errors found here are rendered by ``cni.spec.errors`` (the slow path).
"""

import _socket
import os
import stat
import sys

from cni.spec import envcheck, wire

DEFAULT_SOCKET = "/run/pycni/pycnid.sock"
CONNECT_TIMEOUT = 2.0
DEFAULT_TIMEOUT = 90.0
MAX_TIMEOUT = 86400.0
SUPPORTED = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")  # = cni.spec.versions.SUPPORTED
CURRENT = "1.1.0"
START_HINT = (
    "start the node daemon: `systemctl start pycnid` or `pycnid --config /etc/pycni/pycnid.json`"
)


class Failure(Exception):
    """(code, msg, details) found before or instead of talking to the daemon."""


def about(plugin):
    return (
        f"pycni-{plugin}: pycni CNI plugin (served by pycnid)\n"
        f"CNI protocol versions supported: {', '.join(SUPPORTED)}\n"
    )


def version_reply():
    quoted = ", ".join(f'"{v}"' for v in SUPPORTED)
    return f'{{"cniVersion": "{CURRENT}", "supportedVersions": [{quoted}]}}'


def socket_path(plugin, stdin, environ):
    """netconf `daemonSocket` (for IPAM `ipam.daemonSocket` first) > $PYCNI_SOCKET > default."""
    if b"daemonSocket" in stdin:
        found = scan_daemon_socket(stdin)
        if found is None:
            found = parse_daemon_socket(plugin, stdin)
        if found:
            return found
    return environ.get("PYCNI_SOCKET") or DEFAULT_SOCKET


def scan_daemon_socket(stdin):
    """The one `"daemonSocket": "<path>"` of a config, found without importing json (whose
    import of `re` costs more than the rest of this process). None when it is not that
    simple (several occurrences, escapes): then the config is parsed properly."""
    key = b'"daemonSocket"'
    start = stdin.find(key)
    if start < 0 or stdin.find(key, start + 1) >= 0:
        return None
    rest = stdin[start + len(key) :].lstrip()
    if not rest.startswith(b":"):
        return None
    rest = rest[1:].lstrip()
    end = rest.find(b'"', 1)
    if not rest.startswith(b'"') or end < 0 or b"\\" in rest[:end]:
        return None
    return rest[1:end].decode("utf-8", "replace")


def parse_daemon_socket(plugin, stdin):
    import json

    try:
        config = json.loads(stdin)
        ipam = config.get("ipam") if isinstance(config.get("ipam"), dict) else {}
    except (ValueError, AttributeError, RecursionError):
        return None  # the daemon (or the slow path) reports the config error precisely
    own = ipam.get("daemonSocket") if plugin == "ipam" else None
    for key, value in (("ipam.daemonSocket", own), ("daemonSocket", config.get("daemonSocket"))):
        if isinstance(value, str) and value:
            try:
                value.encode()
            except UnicodeEncodeError:
                raise Failure(
                    7,
                    f"invalid network config key {key!r}",
                    f"{value!r} is not valid UTF-8 (a lone surrogate)",
                ) from None
            return value
    return None


def request_timeout(environ):
    """$PYCNI_TIMEOUT seconds (default 90): a number > 0 and at most a day, else code 4."""
    text = environ.get("PYCNI_TIMEOUT")
    if not text:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= MAX_TIMEOUT:  # also false for nan
        raise Failure(
            4,
            "invalid PYCNI_TIMEOUT",
            f"{text!r}: expected seconds, a number > 0 and at most {MAX_TIMEOUT:g}",
        )
    return seconds


def open_netns(path, required):
    """Open CNI_NETNS read-only; never create it. A netns file (nsfs, or its bind mount) stats
    as a regular file: anything else is refused before it is opened (a FIFO would block, a
    device would be opened), and once more on the open fd, opened without blocking."""
    if not path:
        return None
    try:
        check_netns_kind(path, os.stat(path).st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError as exc:
        if required:
            msg = f"CNI_NETNS={path!r} not found"
            raise Failure(3, "network namespace does not exist", msg) from exc
        return None
    except OSError as exc:
        if required:
            raise Failure(4, "cannot open CNI_NETNS", f"{path!r}: {exc.strerror}") from exc
        return None
    try:
        check_netns_kind(path, os.fstat(fd).st_mode)  # replaced between the stat and the open
    except Failure:
        os.close(fd)
        raise
    return fd


def check_netns_kind(path, mode):
    if not stat.S_ISREG(mode):
        kind = (
            "a directory"
            if stat.S_ISDIR(mode)
            else "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a device file"
        )
        raise Failure(4, "invalid CNI_NETNS", f"{path!r} is {kind}, not a network namespace")


def exchange(path, request, netns_fd, timeout):
    """Send one request, read one reply. Unreachable daemon or timeout -> code 11."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(path)
        except OSError as exc:
            raise Failure(
                11, f"pycnid is not reachable at {path}", f"{exc.strerror or exc}; {START_HINT}"
            ) from exc
        sock.settimeout(timeout)
        refused = send_request(sock, request, netns_fd)
        chunks = receive_reply(sock, refused)
    except _socket.timeout as exc:
        raise Failure(
            11,
            f"pycnid at {path} did not answer within {timeout:g}s",
            "the request may still complete; the runtime should retry",
        ) from exc
    except OSError as exc:
        raise Failure(11, f"pycnid at {path} closed the connection", str(exc)) from exc
    finally:
        sock.close()
    try:
        return wire.decode_reply(b"".join(chunks))
    except ValueError as exc:
        raise Failure(
            11,
            f"pycnid at {path} sent no reply",
            "the daemon may have stopped mid-request; the runtime should retry",
        ) from exc


def send_request(sock, request, netns_fd):
    """None, or the error that ended the send: pycnid may refuse a request mid-send (too large),
    and then its reply is waiting to be read."""
    anc = []
    if netns_fd is not None:
        anc = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, netns_fd.to_bytes(4, sys.byteorder))]
    try:
        sent = sock.sendmsg([request], anc)
        if sent < len(request):
            sock.sendall(request[sent:])
        sock.shutdown(_socket.SHUT_WR)
    except (BrokenPipeError, ConnectionResetError) as exc:
        return exc
    return None


def receive_reply(sock, refused):
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:  # closed with our request unread, after its reply
            if chunks or refused is None:
                break
            raise refused from None
        if not chunk:
            if not chunks and refused is not None:
                raise refused
            return chunks
        chunks.append(chunk)
    return chunks


def render_failure(failure, stdin, command):
    """Slow path: a config problem outranks 'daemon unreachable', so check it fully here."""
    from cni.spec.errors import BY_CODE, CNIError
    from cni.spec.request import parse_config

    code, msg, details = failure.args
    version = None
    try:
        version = parse_config(stdin, command).get("cniVersion")
    except CNIError as err:
        if code in (11, 3):
            return err.to_json(), 1
    err = BY_CODE.get(code, CNIError)(msg, details)
    return err.to_json(version), 1


def run(plugin, environ, stdin):
    """Serve one invocation; returns (stdout text, exit code)."""
    command = environ.get("CNI_COMMAND", "")
    if command == "VERSION":
        return version_reply(), 0
    try:
        problem = envcheck.check_env(environ)
        if problem:
            raise Failure(*problem)
        timeout = request_timeout(environ)
        path = socket_path(plugin, stdin, environ)
        env = {k: v for k, v in environ.items() if k.startswith("CNI_")}
        netns_fd = open_netns(environ.get("CNI_NETNS", ""), required=command in ("ADD", "CHECK"))
        try:
            request = build_request(plugin, env, stdin, command, netns_fd is not None)
            return exchange(path, request, netns_fd, timeout)[::-1]
        finally:
            if netns_fd is not None:
                os.close(netns_fd)
    except Failure as failure:
        return render_failure(failure, stdin, command)


def build_request(plugin, env, stdin, command, has_fd):
    """The framed request, within wire.MAX_REQUEST: a DEL over it sends only what DEL needs
    (network, container ID, ifname: cni.spec.delconf); anything else over it is code 7."""
    request = wire.encode_request(plugin, env, stdin, has_fd)
    if len(request) <= wire.MAX_REQUEST:
        return request
    if command == "DEL":
        from cni.spec.delconf import netconf_for_del

        smaller = netconf_for_del(stdin, wire.MAX_REQUEST - (len(request) - len(stdin)))
        if smaller is not None:
            return wire.encode_request(plugin, env, smaller, has_fd)
    raise Failure(*wire.too_large(len(request)))


def internal_error(plugin, exc):
    """The safety net, not a fix: a bug still answers one spec error (999), never a traceback."""
    import json

    try:
        details = f"{type(exc).__name__}: {exc}"
    except Exception:
        details = type(exc).__name__
    return json.dumps(
        {"code": 999, "msg": f"internal error in pycni-{plugin}", "details": details}, indent=4
    ), 1


def serve_invocation(plugin, environ):
    try:
        stdin = sys.stdin.buffer.read() if environ["CNI_COMMAND"] != "VERSION" else b""
    except OSError as exc:
        return render_failure(Failure(5, "failed to read stdin", str(exc)), b"", "")
    return run(plugin, environ, stdin)


def main(plugin):
    environ = os.environ
    if not environ.get("CNI_COMMAND"):
        sys.stderr.write(about(plugin))
        sys.exit(0)
    try:
        out, code = serve_invocation(plugin, environ)
    except Exception as exc:
        out, code = internal_error(plugin, exc)
    if out:
        sys.stdout.write(out if out.endswith("\n") else out + "\n")
    sys.stdout.flush()
    sys.exit(code)


def main_bridge():
    main("bridge")


def main_ipam():
    main("ipam")


def main_svc():
    main("svc")

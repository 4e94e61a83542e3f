"""The framing between a plugin executable and pycnid (builtins only, no JSON on the fast path).

request: b"PYCNI1 <plugin> <env bytes> <stdin bytes> <has fd>\\n" + env + stdin
         env = b"\\0".join(b"KEY=VALUE" for the CNI_* variables)
reply:   b"<exit code>\\n" + the bytes to print on stdout
The netns fd, if any, rides on the first chunk as SCM_RIGHTS.
A request is at most MAX_REQUEST bytes, header included: the executable checks before it sends,
pycnid checks the header's lengths before it reads the rest and answers `too_large` instead.
"""

DEFAULT_SOCKET = "/run/pycni/pycnid.sock"  # where pycnid listens unless told otherwise
MAGIC = b"PYCNI1"
MAX_REQUEST = 4 << 20
MAX_HEAD = 256  # "PYCNI1 <plugin> <len> <len> <0|1>\n", far longer than any real header


def too_large(size):
    """The error (code, msg, details) for a request of `size` bytes, on both sides."""
    return (
        7,
        f"request of {size} bytes is over pycnid's limit of {MAX_REQUEST} bytes",
        "the netconf (stdin) and CNI_* variables together must fit in the limit",
    )


def encode_request(plugin, env, stdin, has_fd):
    blob = b"\0".join(f"{k}={v}".encode() for k, v in env.items())
    head = b"%s %s %d %d %d\n" % (
        MAGIC,
        plugin.encode(),
        len(blob),
        len(stdin),
        1 if has_fd else 0,
    )
    return head + blob + stdin


def request_size(data):
    """The whole size a request's header announces; None while its header is incomplete."""
    head, sep, _rest = data.partition(b"\n")
    if not sep:
        if len(head) > MAX_HEAD or not MAGIC.startswith(head[: len(MAGIC)]):
            raise ValueError("not a pycni request")
        return None
    parts = head.split(b" ")
    if len(parts) != 5 or parts[0] != MAGIC or not (parts[2].isdigit() and parts[3].isdigit()):
        raise ValueError("not a pycni request")
    return len(head) + 1 + int(parts[2]) + int(parts[3])


def decode_request(data):
    """-> (plugin, env dict, stdin bytes, has_fd); ValueError if malformed."""
    size = request_size(data)
    if size is None:
        raise ValueError("not a pycni request")
    head, _sep, rest = data.partition(b"\n")
    parts = head.split(b" ")
    env_len = int(parts[2])
    if len(data) != size:
        raise ValueError("truncated pycni request")
    env = {}
    for item in rest[:env_len].split(b"\0"):
        if item:
            key, _, value = item.decode("utf-8", "replace").partition("=")
            env[key] = value
    return parts[1].decode("utf-8", "replace"), env, rest[env_len:], parts[4] == b"1"


def encode_reply(exit_code, stdout):
    return b"%d\n" % exit_code + stdout.encode()


def decode_reply(data):
    """-> (exit code, stdout text); ValueError if malformed."""
    head, sep, body = data.partition(b"\n")
    if not sep:
        raise ValueError("no reply")
    return int(head), body.decode("utf-8", "replace")

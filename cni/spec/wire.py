"""The framing between a plugin executable and pycnid (builtins only, no JSON on the fast path).

request: b"PYCNI1 <plugin> <env bytes> <stdin bytes> <has fd>\\n" + env + stdin
         env = b"\\0".join(b"KEY=VALUE" for the CNI_* variables)
reply:   b"<exit code>\\n" + the bytes to print on stdout
The netns fd, if any, rides on the first chunk as SCM_RIGHTS.
"""

MAGIC = b"PYCNI1"


def encode_request(plugin, env, stdin, has_fd):
    blob = b"\0".join(f"{k}={v}".encode() for k, v in env.items())
    head = b"%s %s %d %d %d\n" % (MAGIC, plugin.encode(), len(blob), len(stdin), 1 if has_fd else 0)
    return head + blob + stdin


def decode_request(data):
    """-> (plugin, env dict, stdin bytes, has_fd); ValueError if malformed."""
    head, sep, rest = data.partition(b"\n")
    parts = head.split(b" ")
    if not sep or len(parts) != 5 or parts[0] != MAGIC:
        raise ValueError("not a pycni request")
    env_len, stdin_len = int(parts[2]), int(parts[3])
    if len(rest) != env_len + stdin_len:
        raise ValueError("truncated pycni request")
    env = {}
    for item in rest[:env_len].split(b"\0"):
        if item:
            key, _, value = item.decode("utf-8", "replace").partition("=")
            env[key] = value
    return parts[1].decode(), env, rest[env_len:], parts[4] == b"1"


def encode_reply(exit_code, stdout):
    return b"%d\n" % exit_code + stdout.encode()


def decode_reply(data):
    """-> (exit code, stdout text); ValueError if malformed."""
    head, sep, body = data.partition(b"\n")
    if not sep:
        raise ValueError("no reply")
    return int(head), body.decode("utf-8", "replace")

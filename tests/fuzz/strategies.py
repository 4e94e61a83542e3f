"""Strategies over what an executable and pycnid read: netconfs, prevResults, CNI_* variables
(as bytes) and raw socket frames.

A netconf is generated as a valid one of some plugin, then mutated a few times at random
places: a key dropped, a value retyped, a key set from the vocabulary pycni reads, a key
duplicated in the raw text, a value nested ~1000 levels deep or made huge. ``render`` turns the
tree into JSON text; ``Raw`` is emitted verbatim (``1e400``, deep nesting), ``Dup`` is an
object whose keys may repeat. Lone surrogates, NUL and non-ASCII text come from ``texts``. No
text names a reference plugin: host-local given no dataDir would write leases under /var/lib/cni
on this machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
COMMANDS = ("ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION")
MIN_VERSION = {"CHECK": "0.4.0", "STATUS": "1.1.0", "GC": "1.1.0"}
SPECIAL_TEXT = (
    "",
    "\ud800",
    "\udfff",
    "a\ud800b",
    "a\u0000b",
    "\x00",
    "ü" * 8,
    "ü" * 16,
    "a" * 15,
    "a" * 16,
    ".",
    "..",
    "a/b",
    "a:b",
    "a b",
    "\n",
    "\u202e",
    "🙂",
    "eth0",
    "0.0.0.0/0",
    "::/0",
    "10.0.0.1",
    "fe80::1",
    "300.1.1.1/33",
    "10.91.0.0/24",
    "10.91.0.1",
    "1.1.0",
    "0.4.0",
    "9.9.9",
    "1.0",
    "pycni-ipam",
    "pycni-bridge",
    "nft",
    "-1",
    "NaN",
    "%s%n",
    "${PATH}",
    "00:11:22:33:44:55",
    "zz:zz",
)
# keys pycni reads, by where they live
TOP_KEYS = (
    "cniVersion",
    "cniVersions",
    "name",
    "type",
    "bridge",
    "isGateway",
    "isDefaultGateway",
    "forceAddress",
    "ipMasq",
    "ipMasqBackend",
    "hairpinMode",
    "promiscMode",
    "mtu",
    "mac",
    "dns",
    "ipam",
    "prevResult",
    "runtimeConfig",
    "args",
    "capabilities",
    "daemonSocket",
    "vlan",
    "cni.dev/valid-attachments",
    "cni.dev/attachments",
)
IPAM_KEYS = (
    "type",
    "ranges",
    "routes",
    "dns",
    "subnet",
    "gateway",
    "rangeStart",
    "rangeEnd",
    "dataDir",
    "pool",
    "pools",
    "blockSize",
    "daemonSocket",
    "nodeLabels",
)
ROUTE_KEYS = ("dst", "gw", "mtu", "advmss", "priority", "table", "scope")
RESULT_KEYS = (
    "cniVersion",
    "interfaces",
    "ips",
    "routes",
    "dns",
    "name",
    "mac",
    "sandbox",
    "address",
    "gateway",
    "interface",
    "version",
    "mtu",
    "socketPath",
    "pciID",
)
VOCABULARY = TOP_KEYS + IPAM_KEYS + ROUTE_KEYS + RESULT_KEYS
DEPTHS = (998, 999, 1000, 1001, 3000, 100_000)


@dataclass(frozen=True)
class Raw:
    """JSON text emitted as is (numbers json.dumps cannot write, deep nesting)."""

    text: str


@dataclass(frozen=True)
class Dup:
    """A JSON object as (key, value) pairs: keys may repeat (the last one wins in Python)."""

    pairs: tuple


def render(value: Any, ascii_only: bool = True) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Dup):
        return (
            "{"
            + ", ".join(
                f"{json.dumps(k, ensure_ascii=ascii_only)}: {render(v, ascii_only)}"
                for k, v in value.pairs
            )
            + "}"
        )
    if isinstance(value, dict):
        return render(Dup(tuple(value.items())), ascii_only)
    if isinstance(value, list):
        return "[" + ", ".join(render(v, ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


def to_bytes(value: Any, ascii_only: bool = True) -> bytes:
    """JSON text as bytes; a lone surrogate written raw becomes invalid UTF-8 (CESU-8)."""
    return render(value, ascii_only).encode("utf-8", "surrogatepass")


texts = st.one_of(
    st.sampled_from(SPECIAL_TEXT),
    st.text(max_size=24),
    st.text(st.characters(codec=None, exclude_categories=()), max_size=8),
)
numbers = st.one_of(
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -1, 1, 255, 256, 65535, 65536, 2**31, 2**32 - 1, 2**32, 2**63, 2**64]),
    st.sampled_from(
        [
            Raw("1e400"),
            Raw("-1e400"),
            Raw("NaN"),
            Raw("Infinity"),
            Raw("-0.0"),
            Raw("1" + "0" * 5000),
        ]
    ),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(VOCABULARY), texts), inner, max_size=3),
    ),
    max_leaves=6,
)


def deep(depth: int, kind: str) -> Raw:
    if kind == "list":
        return Raw("[" * depth + "1" + "]" * depth)
    return Raw('{"a": ' * depth + "1" + "}" * depth)


deep_values = st.builds(deep, st.sampled_from(DEPTHS), st.sampled_from(["list", "dict"]))
huge_values = st.one_of(
    st.builds(lambda n, c: c * n, st.sampled_from([10_000, 300_000]), st.sampled_from("aü\x00")),
    st.builds(lambda n: [{"dst": "0.0.0.0/0"}] * n, st.sampled_from([1000, 20_000])),
    st.builds(lambda n: {f"k{i}": i for i in range(n)}, st.sampled_from([1000, 20_000])),
)
# mostly values of the wrong type or range; now and then deep or huge (each costs a case that
# stops at decoding)
weird_values = st.one_of(
    json_values, json_values, json_values, json_values, deep_values, huge_values
)


def paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in a tree (dicts and lists; not inside Raw/Dup)."""
    found = [prefix]
    if isinstance(tree, dict):
        for key, value in tree.items():
            found += paths(value, prefix + (key,))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            found += paths(value, prefix + (index,))
    return found


def get(tree: Any, path: tuple) -> Any:
    for step in path:
        tree = tree[step]
    return tree


def replace(tree: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(tree, dict):
        return {**tree, head: replace(tree[head], rest, value)}
    return [replace(v, rest, value) if i == head else v for i, v in enumerate(tree)]


def drop(tree: Any, path: tuple) -> Any:
    parent = get(tree, path[:-1])
    if isinstance(parent, dict):
        shrunk: Any = {k: v for k, v in parent.items() if k != path[-1]}
    else:
        shrunk = [v for i, v in enumerate(parent) if i != path[-1]]
    return replace(tree, path[:-1], shrunk)


def shielded(path: tuple, protect: frozenset) -> bool:
    return any(path[: len(p)] == p for p in protect)


@st.composite
def mutation(draw, tree: Any, protect: frozenset = frozenset()) -> Any:
    """One mutation at a random place of ``tree``, never at or under a ``protect``ed path
    (host-local's dataDir: a mutated one would write leases anywhere on the machine)."""
    path = draw(st.sampled_from([p for p in paths(tree) if not shielded(p, protect)] or [()]))
    if shielded(path, protect):
        return tree
    node = get(tree, path)
    op = draw(st.sampled_from(["drop", "drop", "retype", "retype", "set", "set", "dup", "deep"]))
    if op == "drop" and path:
        return drop(tree, path)
    if op == "deep":
        return replace(tree, path, draw(deep_values))
    if op in ("set", "dup") and isinstance(node, dict):
        key = draw(
            st.one_of(st.sampled_from(VOCABULARY), st.sampled_from(list(node) or ["a"]), texts)
        )
        value = draw(weird_values)
        if shielded(path + (key,), protect):
            return tree
        if op == "set":
            return replace(tree, path, {**node, key: value})
        pairs = list(node.items())
        return replace(
            tree,
            path,
            Dup(tuple([(key, value)] + pairs if draw(st.booleans()) else pairs + [(key, value)])),
        )
    return replace(tree, path, draw(weird_values))


@st.composite
def mutated(draw, base: Any, max_mutations: int = 3, protect: frozenset = frozenset()) -> bytes:
    """``base`` with 0..max_mutations mutations, as JSON bytes."""
    tree = base
    for _ in range(draw(st.integers(0, max_mutations))):
        if isinstance(tree, (Raw, Dup)):
            break
        tree = draw(mutation(tree, protect))
    return to_bytes(tree, ascii_only=draw(st.booleans()))


garbage_stdin = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b"null",
            b"[]",
            b"{}",
            b"1",
            b'"x"',
            b"{",
            b'{"cniVersion":',
            b"\xff\xfe",
            b'{"name": "\xff"}',
            b"\x00",
            b'{"a":1}\x00{"b":2}',
            b"\xef\xbb\xbf{}",
            b'{"cniVersion": "1.1.0", "name": "n", "name": 3}',
        ]
    ),
)


def version_for(command: str) -> st.SearchStrategy[str]:
    """Mostly a version the verb accepts (so cases reach the plugin), sometimes any."""
    minimum = MIN_VERSION.get(command, "0.3.0")
    fitting = [v for v in VERSIONS if v >= minimum]
    return st.one_of(
        st.sampled_from(fitting),
        st.sampled_from(fitting),
        st.sampled_from(VERSIONS + ("0.1.0", "9.9.9", "1.1", "")),
    )


def result_in(version: str, sandbox: str) -> dict:
    """A plausible ADD result of pycni-bridge in ``version`` (the shape prevResult arrives in)."""
    ip = {"address": "10.91.0.2/24", "gateway": "10.91.0.1", "interface": 2}
    if version < "1.0.0":
        ip["version"] = "4"
    route = {"dst": "0.0.0.0/0", "gw": "10.91.0.1"}
    if version == "1.1.0":
        route.update(table=254, scope=0, priority=0, mtu=1500, advmss=1460)
    return {
        "cniVersion": version,
        "interfaces": [
            {"name": "fz0", "mac": "02:00:00:00:00:01"},
            {"name": "veth0123456789a", "mac": "02:00:00:00:00:02"},
            {"name": "eth0", "mac": "02:00:00:00:00:03", "sandbox": sandbox},
        ],
        "ips": [ip],
        "routes": [route],
        "dns": {"nameservers": ["10.91.0.53"]},
    }


# --- the CNI_* environment, as bytes (what os.environb hands the executable) --------------


def env_bytes(plausible: list[bytes]) -> st.SearchStrategy[bytes | None]:
    """A variable's value: one of the plausible ones, odd bytes (non-UTF-8), or unset (None)."""
    odd = st.one_of(
        st.binary(max_size=24),
        st.sampled_from(
            [
                b"",
                b"\xff",
                b"a\xffb",
                b"\xed\xa0\x80",
                b"\xc3",
                "ü".encode() * 8,
                b" ",
                b"a" * 4096,
            ]
        ),
    )
    return st.one_of(*[st.sampled_from(plausible)] * 4, odd, st.none())


def no_nul(value: bytes | None) -> bytes | None:
    return None if value is None else value.replace(b"\0", b"")


@st.composite
def cni_environ(
    draw,
    *,
    netns: list[bytes],
    sockets: list[bytes],
    cni_path: bytes,
    command: bytes | None = None,
) -> dict[bytes, bytes]:
    """Every CNI_* variable (and PYCNI_SOCKET/PYCNI_TIMEOUT) with odd values mixed in."""
    choices = {
        b"CNI_COMMAND": [command] if command else [c.encode() for c in COMMANDS] * 3 + [b"add"],
        b"CNI_CONTAINERID": [b"fzc1", b"fzc-2.x_y", b"-bad", b"a" * 300, "ü".encode()],
        b"CNI_NETNS": netns,
        b"CNI_IFNAME": [b"eth0", b"net1", b"a" * 15, b"a" * 16, "ü".encode() * 8, b".", b"a/b"],
        b"CNI_ARGS": [
            b"",
            b"IgnoreUnknown=1;K8S_POD_NAME=web-0",
            b"K=V",
            b"novalue",
            b"=x",
            b";;",
            b"K8S_POD_NAME=\xff",
        ],
        b"CNI_PATH": [cni_path, b"", b"/nonexistent", cni_path + b":\xff"],
        # no value that times out before pycnid is done (its late success would look like a
        # refused request that changed state): invalid ones, or longer than a request takes
        b"PYCNI_TIMEOUT": [b"", b"30", b"abc", b"nan", b"inf", b"-inf", b"-1", b"1e400", b" "],
    }
    env = {b"PATH": b"/usr/sbin:/usr/bin:/sbin:/bin"}
    for key, plausible in choices.items():
        value = no_nul(draw(env_bytes(plausible)))
        if key == b"CNI_COMMAND" and command:
            value = command
        if value is not None:
            env[key] = value
    # never unset or empty: the default socket may be a real pycnid serving this machine
    env[b"PYCNI_SOCKET"] = draw(st.sampled_from(sockets))
    if draw(st.booleans()):
        env[b"CNI_" + draw(st.sampled_from([b"EXTRA", b"\xff", b"PATH2"]))] = (
            no_nul(draw(st.binary(max_size=8))) or b"x"
        )
    return env


# --- raw frames to pycnid (cni/spec/wire.py) ---------------------------------------------


@st.composite
def frames(draw, valid_stdin: bytes) -> tuple[bytes, bool]:
    """A request frame, well-formed or not; returns (bytes, whether it is well-formed: magic,
    five fields, an ASCII plugin name and the lengths right; the env and stdin may be anything)."""
    env = draw(
        st.lists(
            st.one_of(
                # no ADD: a frame never creates an attachment, so none may change state
                st.sampled_from(
                    [
                        b"CNI_COMMAND=STATUS",
                        b"CNI_COMMAND=DEL",
                        b"CNI_CONTAINERID=fzframe",
                        b"CNI_IFNAME=eth0",
                        b"CNI_ARGS=\xff",
                        b"CNI_COMMAND=CHECK",
                        b"CNI_COMMAND=GC",
                        b"CNI_COMMAND=VERSION",
                        b"CNI_COMMAND",
                        b"=",
                        b"CNI_NETNS=/proc/self/ns/net",
                    ]
                ),
                st.binary(max_size=16),
            ),
            max_size=5,
        )
    )
    blob = b"\0".join(env)
    stdin = draw(st.one_of(st.just(valid_stdin), garbage_stdin))
    plugin = draw(st.sampled_from([b"bridge", b"ipam", b"svc", b"nope", b"", b"\xff"]))
    has_fd = draw(st.sampled_from([b"0", b"1", b"2", b"x"]))
    lengths = [str(len(blob)).encode(), str(len(stdin)).encode()]
    if draw(st.booleans()):
        lengths[draw(st.integers(0, 1))] = draw(
            st.sampled_from(
                [b"-1", b"0", b"x", b"", b"99999999999999999999", b"1e3", b" 1", b"\xff"]
            )
        )
    fields = [b"PYCNI1", plugin, *lengths, has_fd]
    if draw(st.integers(0, 5)) == 0:
        fields[0] = draw(st.sampled_from([b"PYCNI2", b"pycni1", b"", b"GET / HTTP/1.1"]))
    if draw(st.integers(0, 5)) == 0:
        fields.append(b"extra")
    sep = b"\n" if draw(st.integers(0, 7)) else b""
    frame = b" ".join(fields) + sep + blob + stdin
    framed = (
        sep == b"\n"
        and fields[0] == b"PYCNI1"
        and len(fields) == 5
        and plugin.isascii()
        and lengths == [str(len(blob)).encode(), str(len(stdin)).encode()]
    )
    return frame, framed

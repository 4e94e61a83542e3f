"""cnitool's behaviour as functions: the environment it reads, the container ID it derives,
and one verb run over a loaded list. The `pycni net` click layer only
parses arguments and calls `run_net`.

NETCONFPATH (default /etc/cni/net.d), CNI_PATH, CNI_ARGS (every pair `K=V` with non-empty
key and value), CAP_ARGS (a JSON object), CNI_IFNAME (default eth0; the flag wins) and, for
tests and unprivileged use, CNI_CACHE_DIR (default /var/lib/cni, as libcni's CacheDir).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from cni.runtime.cache import DEFAULT_CACHE_DIR
from cni.runtime.chain import Runtime
from cni.runtime.conflist import NetworkConfigList, load_network_conf
from cni.runtime.errors import JoinedErrors, PluginFailed
from cni.runtime.inject import RuntimeConf
from cni.runtime.invoke import PluginNotFound
from cni.spec.errors import CNIError, DecodingFailure, InvalidEnvironment

DEFAULT_NET_DIR = "/etc/cni/net.d"
DEFAULT_IFNAME = "eth0"
VERBS = ("add", "check", "del", "gc", "status")


@dataclass(frozen=True)
class ToolEnv:
    conf_dir: str
    path: tuple[str, ...]
    cni_args: tuple[tuple[str, str], ...]
    capability_args: dict[str, Any]
    ifname: str
    cache_dir: str


def parse_tool_args(text: str) -> tuple[tuple[str, str], ...]:
    """cnitool's CNI_ARGS: `K=V;K=V`, each pair exactly one '=' with both sides non-empty."""
    if not text:
        return ()
    pairs = []
    for pair in text.split(";"):
        parts = pair.split("=")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise InvalidEnvironment(
                f"invalid CNI_ARGS pair {pair!r}",
                "CNI_ARGS is KEY=VALUE;KEY=VALUE with non-empty keys and values",
            )
        pairs.append((parts[0], parts[1]))
    return tuple(pairs)


def parse_cap_args(text: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise DecodingFailure("CAP_ARGS is not valid JSON", str(exc)) from None
    if not isinstance(value, dict):
        raise DecodingFailure(
            "CAP_ARGS must be a JSON object",
            'e.g. {"portMappings": [{"hostPort": 8080, "containerPort": 80}]}',
        )
    return value


def tool_env(environ: Mapping[str, str], ifname: str | None = None) -> ToolEnv:
    return ToolEnv(
        conf_dir=environ.get("NETCONFPATH") or DEFAULT_NET_DIR,
        path=tuple(p for p in environ.get("CNI_PATH", "").split(os.pathsep) if p),
        cni_args=parse_tool_args(environ.get("CNI_ARGS", "")),
        capability_args=parse_cap_args(environ.get("CAP_ARGS", "")),
        ifname=ifname or environ.get("CNI_IFNAME") or DEFAULT_IFNAME,
        cache_dir=environ.get("CNI_CACHE_DIR") or DEFAULT_CACHE_DIR,
    )


def container_id_for(netns: str) -> str:
    """`cnitool-` + hex of the first 10 bytes of sha512(absolute netns path)."""
    return "cnitool-" + hashlib.sha512(os.path.abspath(netns).encode()).digest()[:10].hex()


def runtime_conf(netns: str, env: ToolEnv) -> RuntimeConf:
    path = os.path.abspath(netns)
    return RuntimeConf(
        container_id=container_id_for(path),
        netns=path,
        ifname=env.ifname,
        args=env.cni_args,
        capability_args=env.capability_args,
    )


def run_net(
    verb: str, network: str, netns: str, env: ToolEnv, stderr: IO[str] | None = None
) -> dict[str, Any] | None:
    """One cnitool verb; `add` returns the final result, the others None."""
    conf: NetworkConfigList = load_network_conf(env.conf_dir, network)
    rt = runtime_conf(netns, env)
    runtime = Runtime(path=env.path, cache_dir=env.cache_dir, stderr=stderr)
    if verb == "add":
        return runtime.add_network_list(conf, rt)
    if verb == "check":
        runtime.check_network_list(conf, rt)
    elif verb == "del":
        runtime.del_network_list(conf, rt)
    elif verb == "gc":
        runtime.gc_network_list(conf, None)
    elif verb == "status":
        runtime.status_network_list(conf)
    else:
        raise ValueError(f"unknown verb {verb!r}")
    return None


CODE_MEANINGS = {
    1: "incompatible CNI version",
    2: "unsupported field",
    3: "unknown container",
    4: "invalid environment",
    5: "I/O failure",
    6: "failed to decode content",
    7: "invalid network config",
    11: "try again later",
    50: "plugin not available",
    51: "plugin not available, existing containers degraded",
    100: "check failed",
    101: "address exhausted",
    102: "address conflict",
    999: "internal error",
}


def describe_error(exc: CNIError, verb: str, network: str, netns: str) -> str:
    """A readable error for a person: which plugin failed, the CNI code and its meaning, the
    message and details, and how to clean up after a failed ADD."""
    errors = exc.errors if isinstance(exc, JoinedErrors) else [exc]
    lines = []
    for error in errors:
        head = f"pycni net {verb} {network}:"
        if isinstance(error, PluginFailed):
            lines.append(f"{head} {error.where}")
            head = " "
        meaning = CODE_MEANINGS.get(error.code, "plugin-specific")
        lines.append(f"{head} CNI error {error.code} ({meaning}): {error.msg}")
        if error.details:
            lines.append(f"  details: {error.details}")
    if verb == "add" and any(_made_something(e) for e in errors):
        lines.append(
            f"  the attachment may be half made; clean up with: pycni net del {network} {netns}"
        )
    return "\n".join(lines)


def _made_something(error: CNIError) -> bool:
    """Whether a failed ADD may have left state behind (a plugin ran)."""
    return isinstance(error, PluginFailed) and not (
        error.index == 0 and isinstance(error.cause, PluginNotFound)
    )

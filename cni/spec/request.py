"""Reading one CNI request: the CNI_* environment, CNI_ARGS and the network config on stdin.

Standard library only. The executable validates with it before it talks to the daemon, and
the daemon parses the same request again into a ``Request``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cni.spec import envcheck
from cni.spec.envcheck import ID_PATTERN, valid_id
from cni.spec.errors import BY_CODE, DecodingFailure, InvalidConfig, InvalidEnvironment
from cni.spec.versions import validate_version

# Far above any real netconf (a conflist plugin with prevResult nests ~6 levels) and far below
# what would exhaust Python's recursion limit in the code that reads it.
MAX_DEPTH = 64


@dataclass(frozen=True)
class Env:
    command: str
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: Mapping[str, str] = field(default_factory=dict)
    path: tuple[str, ...] = ()


@dataclass(frozen=True)
class Request:
    """One validated CNI request as a plugin handler sees it."""

    env: Env
    config: Mapping[str, Any]
    netns_fd: int | None = None
    raw_env: Mapping[str, str] = field(default_factory=dict)  # the CNI_* variables as received
    raw_config: bytes = b""

    @property
    def command(self) -> str:
        return self.env.command

    @property
    def version(self) -> str:
        return str(self.config.get("cniVersion", "0.1.0"))

    @property
    def network(self) -> str:
        return str(self.config["name"])

    @property
    def runtime_config(self) -> Mapping[str, Any]:
        value = self.config.get("runtimeConfig")
        return value if isinstance(value, dict) else {}

    @property
    def prev_result(self) -> Any:
        return self.config.get("prevResult")


def raise_env_error(problem: tuple[int, str, str] | None) -> None:
    if problem:
        code, msg, details = problem
        raise BY_CODE.get(code, InvalidEnvironment)(msg, details)


def parse_cni_args(text: str) -> dict[str, str]:
    """'K=V;K=V' -> dict. Unknown keys are kept (plugins ignore them); a pair without '=' is
    an error naming CNI_ARGS."""
    raise_env_error(envcheck.check_cni_args(text))
    pairs = (p.strip().partition("=") for p in text.split(";") if p.strip())
    return {key: value for key, _, value in pairs}


def parse_env(environ: Mapping[str, str]) -> Env:
    """Validate the CNI_* variables for the verb; a problem is code 4 naming the variable."""
    raise_env_error(envcheck.check_env(environ))
    command = environ["CNI_COMMAND"]
    path = tuple(p for p in environ.get("CNI_PATH", "").split(":") if p)
    if command not in envcheck.ATTACHMENT_VERBS:
        return Env(command=command, path=path)
    return Env(
        command=command,
        container_id=environ["CNI_CONTAINERID"],
        netns=environ.get("CNI_NETNS", ""),
        ifname=environ["CNI_IFNAME"],
        args=parse_cni_args(environ.get("CNI_ARGS", "")),
        path=path,
    )


def decode_json(data: bytes | str, what: str) -> Any:
    """Strict JSON: no NaN/Infinity, no number beyond a double, nesting at most MAX_DEPTH
    (code 6), and strings that are valid Unicode (code 7, naming the key). ``what`` names the
    document in the message ("network config", "result of IPAM plugin x")."""
    try:
        value = json.loads(data, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise DecodingFailure(
            f"failed to decode {what}", f"it nests deeper than {MAX_DEPTH} levels"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodingFailure(f"failed to decode {what}", str(exc)) from None
    if not plainly_valid(data):
        validate_tree(value, what)
    return value


def plainly_valid(data: bytes | str) -> bool:
    """A cheap proof that ``validate_tree`` would find nothing (the usual netconf): UTF-8
    bytes with fewer brackets than MAX_DEPTH, no \\u escape and no byte that could start an
    encoded surrogate (json decodes bytes with 'surrogatepass')."""
    return (
        isinstance(data, bytes)
        and data.count(b"[") + data.count(b"{") < MAX_DEPTH
        and b"\\u" not in data
        and b"\xed" not in data
        and b"\0" not in data
    )


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON (a number must be finite)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} does not fit a double")
    return value


def validate_tree(value: Any, what: str) -> None:
    """Walk a decoded document without recursion: too deep is code 6; a key or string that
    is not valid Unicode (a lone surrogate such as "\\ud800") is code 7 naming its key."""
    stack: list[tuple[Any, int, tuple]] = [(value, 0, ())]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            _validate_text(item, path, what)
        elif isinstance(item, (dict, list)):
            if depth >= MAX_DEPTH:
                raise DecodingFailure(
                    f"failed to decode {what}",
                    f"{key_path(path) or 'it'} nests deeper than {MAX_DEPTH} levels",
                )
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str):
                    _validate_text(key, path + (key,), what)
                stack.append((child, depth + 1, path + (key,)))


def _validate_text(text: str, path: tuple, what: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidConfig(
            f"invalid {key_path(path) or what}",
            f"{text[:40]!r} is not valid Unicode (lone surrogate)",
        ) from None


def key_path(path: tuple) -> str:
    """('ipam', 'routes', 0, 'dst') -> 'ipam.routes[0].dst'."""
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out


def parse_config(data: bytes | str, command: str) -> dict:
    """Decode the network config and check its version, name and type."""
    config = decode_json(data, "network config")
    if not isinstance(config, dict):
        raise DecodingFailure("network config is not a JSON object")
    version = config.get("cniVersion", "0.1.0")
    if not isinstance(version, str):
        raise DecodingFailure("invalid cniVersion", f"{version!r} is not a string")
    validate_version(version, command)
    name = config.get("name")
    if command != "VERSION":
        if not isinstance(name, str) or not name:
            raise InvalidConfig("missing network name", "key 'name' must be a non-empty string")
        if not valid_id(name):
            raise InvalidConfig("invalid network name", f"name {name!r} must match {ID_PATTERN}")
        kind = config.get("type")
        if not isinstance(kind, str) or not kind:
            raise InvalidConfig(
                "missing key 'type'" if kind is None else "invalid key 'type'",
                f"'type' names the plugin and must be a non-empty string, got {kind!r}",
            )
    return config


def ipam_type(config: Mapping[str, Any], required: bool = False) -> str | None:
    """The IPAM plugin named by ``ipam.type``: None when there is no ``ipam`` section (an
    IPAM plugin itself requires one); code 7 naming the key when it is not a plugin name."""
    ipam = config.get("ipam")
    if (ipam is None or ipam == {}) and not required:
        return None
    if not isinstance(ipam, dict):
        raise InvalidConfig(
            "missing key 'ipam'" if ipam is None else "invalid key 'ipam'",
            f"expected an object with a string 'type', got {ipam!r}",
        )
    kind = ipam.get("type")
    if not isinstance(kind, str) or not kind:
        raise InvalidConfig(
            "missing key 'ipam.type'" if kind is None else "invalid key 'ipam.type'",
            f"'ipam.type' names the IPAM plugin and must be a non-empty string, got {kind!r}",
        )
    if kind in (".", "..") or "/" in kind or not kind.isprintable():
        raise InvalidConfig(
            "invalid key 'ipam.type'",
            f"{kind!r} must be a plugin name: no '/', no control characters",
        )
    return kind


def gc_valid_attachments(config: Mapping[str, Any]) -> set[tuple[str, str]] | None:
    """(containerID, ifname) pairs the runtime still uses, from either GC key.

    Returns None when neither key is present (cnitool's gc): nothing is valid.
    """
    found: set[tuple[str, str]] = set()
    present = False
    for key in ("cni.dev/valid-attachments", "cni.dev/attachments"):
        items = config.get(key)
        if items is None:
            continue
        present = True
        if not isinstance(items, list):
            raise InvalidConfig(f"invalid {key}", "expected a list of {containerID, ifname}")
        for i, item in enumerate(items):
            found.add(_valid_attachment(item, f"{key}[{i}]"))
    return found if present else None


def _valid_attachment(item: Any, where: str) -> tuple[str, str]:
    if not isinstance(item, dict) or "containerID" not in item:
        raise InvalidConfig(f"invalid {where}", f"entry {item!r} lacks containerID")
    cid, ifname = item["containerID"], item.get("ifname", "")
    if not isinstance(cid, str) or not valid_id(cid):
        raise InvalidConfig(
            f"invalid {where}.containerID", f"{cid!r} must be a string matching {ID_PATTERN}"
        )
    if not isinstance(ifname, str) or envcheck.check_ifname(ifname or "x"):
        raise InvalidConfig(
            f"invalid {where}.ifname",
            f"{ifname!r} must be an interface name (at most 15 characters)",
        )
    return cid, ifname

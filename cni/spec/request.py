"""Reading one CNI request: the CNI_* environment, CNI_ARGS and the network config on stdin.

Standard library only. The executable validates with it before it talks to the daemon, and
the daemon parses the same request again into a ``Request``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import envcheck
from .envcheck import ID_PATTERN, valid_id
from .errors import BY_CODE, DecodingFailure, InvalidConfig, InvalidEnvironment
from .versions import validate_version


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
    return Env(command=command, container_id=environ["CNI_CONTAINERID"],
               netns=environ.get("CNI_NETNS", ""), ifname=environ["CNI_IFNAME"],
               args=parse_cni_args(environ.get("CNI_ARGS", "")), path=path)


def parse_config(data: bytes | str, command: str) -> dict:
    """Decode the network config and check its version and name."""
    try:
        config = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodingFailure("failed to decode network config", str(exc)) from None
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
    return config


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
        for item in items:
            if not isinstance(item, dict) or "containerID" not in item:
                raise InvalidConfig(f"invalid {key}", f"entry {item!r} lacks containerID")
            found.add((str(item["containerID"]), str(item.get("ifname", ""))))
    return found if present else None

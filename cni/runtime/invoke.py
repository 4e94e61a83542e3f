"""Executing one plugin as a CNI runtime does (libcni `pkg/invoke`).

FindInPath: the type must not contain a path separator; the first directory of CNI_PATH
with a regular file of that name wins. Exec: the caller's environment plus the six CNI_*
variables, the config on stdin; retried up to 5 times, 1 s apart, on "text file busy".
A non-zero exit is read as the spec's error JSON from stdout (`error_from_dict`); without
one, stderr (or the exit status) becomes the message, as libcni does.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from cni.spec.errors import (
    CNIError,
    DecodingFailure,
    InvalidEnvironment,
    TryAgainLater,
    error_from_dict,
)
from cni.spec.request import decode_json
from cni.spec.result import canonical

BUSY_RETRIES = 5
BUSY_PAUSE = 1.0


class PluginNotFound(InvalidEnvironment):
    """No executable of that type in CNI_PATH (code 4)."""


@dataclass(frozen=True)
class Invocation:
    """The CNI_* variables of one call (empty strings where the verb has none)."""

    command: str
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: tuple[tuple[str, str], ...] = ()
    path: tuple[str, ...] = ()

    def as_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The caller's environment with the six CNI_* variables appended (they win)."""
        return {
            **base,
            "CNI_COMMAND": self.command,
            "CNI_CONTAINERID": self.container_id,
            "CNI_NETNS": self.netns,
            "CNI_ARGS": ";".join(f"{k}={v}" for k, v in self.args),
            "CNI_IFNAME": self.ifname,
            "CNI_PATH": os.pathsep.join(self.path),
        }


def find_in_path(plugin: str, paths: tuple[str, ...]) -> str:
    if not plugin:
        raise PluginNotFound("no plugin name provided")
    if os.sep in plugin:
        raise PluginNotFound(
            f"invalid plugin name: {plugin}", "a plugin type is a file name, not a path"
        )
    if not paths:
        raise PluginNotFound(
            f"failed to find plugin {plugin!r}: no paths provided",
            "set CNI_PATH to the directories holding the plugin executables",
        )
    for directory in paths:
        candidate = os.path.join(directory, plugin)
        if os.path.isfile(candidate):
            return candidate
    raise PluginNotFound(
        f"failed to find plugin {plugin!r} in path {list(paths)}",
        "check CNI_PATH and the plugin's 'type'",
    )


def plugin_error(returncode: int, stdout: bytes, stderr: bytes) -> CNIError:
    """libcni's pluginErr: the error JSON on stdout, else stderr, else the exit status."""
    out = stdout.decode(errors="replace").strip()
    err = stderr.decode(errors="replace").strip()
    if not out:
        if not err:
            return CNIError(f"netplugin failed with no error message: exit status {returncode}")
        return CNIError("netplugin failed", err)
    try:
        data = decode_json(out, "error")
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (ValueError, CNIError) as exc:
        return CNIError(
            "netplugin failed but error parsing its diagnostic message", f"{out[:2000]!r}: {exc}"
        )
    return error_from_dict(data)


def _run(
    binary: str, stdin: bytes, env: dict[str, str], timeout: float | None
) -> subprocess.CompletedProcess:
    for attempt in range(BUSY_RETRIES + 1):
        try:
            return subprocess.run(
                [binary], input=stdin, env=env, capture_output=True, timeout=timeout
            )
        except OSError as exc:
            if exc.errno != errno.ETXTBSY or attempt == BUSY_RETRIES:
                raise CNIError(f"cannot execute {binary}", exc.strerror or str(exc)) from None
            time.sleep(BUSY_PAUSE)
    raise AssertionError("unreachable")


def exec_plugin(
    binary: str,
    stdin: bytes,
    env: dict[str, str],
    *,
    stderr: IO[str] | None = None,
    timeout: float | None = None,
) -> bytes:
    """Run the plugin; its stdout on success, its error (a CNIError) otherwise."""
    try:
        proc = _run(binary, stdin, env, timeout)
    except subprocess.TimeoutExpired:
        raise TryAgainLater(
            f"{os.path.basename(binary)} did not answer within {timeout:g}s",
            "the plugin was killed; run DEL to clean up what it made",
        ) from None
    if proc.returncode != 0:
        error = plugin_error(proc.returncode, proc.stdout, proc.stderr)
        if proc.stdout.strip():
            _forward(proc.stderr, stderr)
        raise error
    _forward(proc.stderr, stderr)
    return proc.stdout


def _forward(data: bytes, sink: IO[str] | None) -> None:
    if data and sink is not None:
        sink.write(data.decode(errors="replace"))
        sink.flush()


def decode_result(stdout: bytes, conf_version: str) -> dict[str, Any]:
    """An ADD answer: JSON object, `cniVersion` defaulted to the config's (libcni's fixup),
    and well-formed for its version (DecodingFailure otherwise)."""
    try:
        result = decode_json(stdout, "plugin result")
    except CNIError as exc:
        raise DecodingFailure("plugin printed an unreadable result", str(exc)) from None
    if not isinstance(result, dict):
        raise DecodingFailure("plugin printed an unreadable result", "not a JSON object")
    if not result.get("cniVersion"):
        result["cniVersion"] = conf_version
    canonical(result, result["cniVersion"], where="result")
    return result

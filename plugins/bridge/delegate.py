"""Delegation to the IPAM plugin named by `ipam.type`.

`pycni-ipam` is served in-process (same daemon, no exec); any other type (`host-local`,
`static`, `dhcp` …) is executed from CNI_PATH exactly as the spec says: the whole config on
stdin, the same environment with only CNI_COMMAND changed, its stderr passed to our log.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from dataclasses import replace
from typing import Any

from cni.spec import request
from cni.spec.errors import (
    CNIError,
    DelegateFailed,
    InternalError,
    InvalidEnvironment,
    TryAgainLater,
    error_from_dict,
)
from cni.spec.request import Request
from cni.spec.result import canonical
from plugins.ipam.config import cached_ipam_config

log = logging.getLogger("pycnid.delegate")
IN_PROCESS = "pycni-ipam"
EXEC_TIMEOUT = 60.0


def ipam_type(req: Request) -> str | None:
    return request.ipam_type(req.config)


def validate_delegation(plugins: dict[str, Any], req: Request, parse: bool = False) -> None:
    """Before anything is made or removed: the ``ipam`` section names a plugin, and one
    pycnid does not serve can be found in CNI_PATH (code 7 / code 4 naming CNI_PATH).
    ``parse``: also parse pycni-ipam's section (code 7 naming the key)."""
    kind = ipam_type(req)
    if kind is None:
        return
    if kind == IN_PROCESS and "ipam" in plugins:
        if parse:
            cached_ipam_config(req.config)  # what its ADD reads first, remembered
    else:
        find_plugin(kind, req.env.path)


def as_command(req: Request, command: str) -> Request:
    env = replace(req.env, command=command)
    return replace(req, env=env, raw_env={**req.raw_env, "CNI_COMMAND": command})


def delegate(plugins: dict[str, Any], req: Request, command: str) -> dict | None:
    """Run `command` on the configured IPAM; ADD returns its (canonical) result."""
    kind = ipam_type(req)
    if kind is None:
        return None
    sub = as_command(req, command)
    if kind == IN_PROCESS and "ipam" in plugins:
        return _in_process(plugins["ipam"], sub)
    return _exec(kind, sub)


def _in_process(plugin: Any, req: Request) -> dict | None:
    verb = {
        "ADD": plugin.add,
        "DEL": plugin.delete,
        "CHECK": plugin.check,
        "STATUS": plugin.status,
        "GC": plugin.gc,
    }[req.command]
    return verb(req)


def find_plugin(kind: str, path: tuple[str, ...]) -> str:
    for directory in path:
        candidate = os.path.join(directory, kind)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise InvalidEnvironment(
        f"failed to find IPAM plugin {kind!r} in CNI_PATH",
        f"CNI_PATH={':'.join(path) or '(empty)'}",
    )


def _exec(kind: str, req: Request) -> dict | None:
    binary = find_plugin(kind, req.env.path)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CNI_")},
        **{k: v for k, v in req.raw_env.items() if k.startswith("CNI_") and "=" not in k},
    }
    try:
        proc = subprocess.run(
            [binary], input=req.raw_config, env=env, capture_output=True, timeout=EXEC_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        err = TryAgainLater(
            f"IPAM plugin {kind} timed out after {EXEC_TIMEOUT:g}s",
            f"{binary} did not answer {req.command}",
        )
        raise undo_unsettled_add(kind, req, err) from None
    if proc.stderr:
        log.info("ipam %s stderr: %s", kind, proc.stderr.decode(errors="replace").strip())
    out = proc.stdout.decode(errors="replace").strip()
    if proc.returncode != 0:
        raise _exec_error(kind, out, proc.stderr.decode(errors="replace"))
    if req.command != "ADD":
        return None
    try:
        return canonical(
            request.decode_json(out, f"result of IPAM plugin {kind}"),
            req.version,
            where=f"result of IPAM plugin {kind}",
        )
    except CNIError as exc:
        unreadable = DelegateFailed(f"IPAM plugin {kind} returned an unreadable result", str(exc))
        raise undo_unsettled_add(kind, req, unreadable) from None


def undo_unsettled_add(kind: str, req: Request, err: CNIError) -> CNIError:
    """An ADD that timed out or answered an unreadable result may have leased an address
    that no caller knows of: release it (IPAM DEL) before the ADD fails, so a failed ADD
    leaves nothing behind. An IPAM that answered a CNI error cleaned up after itself."""
    if req.command == "ADD":
        try:
            _exec(kind, as_command(req, "DEL"))
        except CNIError as undo_err:
            log.warning("IPAM %s: DEL after the failed ADD failed too: %s", kind, undo_err)
            err.details = f"{err.details}; its DEL failed too: {undo_err}"
    return err


def _exec_error(kind: str, stdout: str, stderr: str) -> CNIError:
    try:
        err = error_from_dict(json.loads(stdout))
    except (ValueError, AttributeError, TypeError, OverflowError, RecursionError):
        return DelegateFailed(f"IPAM plugin {kind} failed", (stdout or stderr).strip()[:2000])
    if err.code in (0, InternalError.code):  # its own "internal" code: not a bug of pycni
        details = "; ".join(filter(None, (err.details, f"{kind} answered code {err.code}")))
        return DelegateFailed(f"{kind}: {err.msg}", details)
    err.msg = f"{kind}: {err.msg}"
    return err

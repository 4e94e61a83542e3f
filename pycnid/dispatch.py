"""Turn one request from an executable into one reply: the only place errors become JSON.

Transport-free: ``Dispatcher.handle`` takes the plugin name, the CNI_* environment, the raw
stdin and the received netns fd, and returns (exit code, stdout text).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from cni.spec.errors import CNIError, InternalError, InvalidConfig
from cni.spec.request import Request, ipam_type, parse_config, parse_env
from cni.spec.result import render
from kernel.ns import validate_netns_fd

log = logging.getLogger("pycnid.dispatch")
# Plugins pycnid serves as IPAM executables: the netconf names them by `ipam.type`, not `type`.
IPAM_PLUGINS = frozenset({"ipam"})


class AttachmentLocks:
    """Serialise requests for the same (containerID, ifname); GC runs alone
    (CNI-CHECKLIST §1.9)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str], list] = {}
        self._gc = threading.Condition()
        self._active = 0
        self._gc_running = False

    @contextmanager
    def attachment(self, key: tuple[str, str]) -> Iterator[None]:
        with self._shared():
            with self._guard:
                entry = self._locks.setdefault(key, [threading.Lock(), 0])
                entry[1] += 1
            try:
                with entry[0]:
                    yield
            finally:
                with self._guard:
                    entry[1] -= 1
                    if entry[1] == 0:
                        self._locks.pop(key, None)

    @contextmanager
    def _shared(self) -> Iterator[None]:
        with self._gc:
            self._gc.wait_for(lambda: not self._gc_running)
            self._active += 1
        try:
            yield
        finally:
            with self._gc:
                self._active -= 1
                self._gc.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._gc:
            self._gc.wait_for(lambda: not self._gc_running)
            self._gc_running = True
            self._gc.wait_for(lambda: self._active == 0)
        try:
            yield
        finally:
            with self._gc:
                self._gc_running = False
                self._gc.notify_all()


class Dispatcher:
    def __init__(self, plugins: Mapping[str, Any], metrics: Any = None) -> None:
        self.plugins = plugins
        self.locks = AttachmentLocks()
        if metrics is None:
            from common.metrics import Registry

            metrics = Registry()
        self.requests = metrics.counter(
            "pycni_requests_total", "CNI requests served, by plugin, command and result code"
        )
        self.latency = metrics.histogram(
            "pycni_request_seconds", "Time to serve one CNI request in pycnid"
        )

    def handle(
        self, plugin_name: str, env_vars: Mapping[str, str], stdin: bytes, netns_fd: int | None
    ) -> tuple[int, str]:
        started = time.monotonic()
        version = None
        req = None
        try:
            env = parse_env(env_vars)
            config = parse_config(stdin, env.command)
            version = config.get("cniVersion")
            if plugin_name in IPAM_PLUGINS and env.command != "VERSION":
                ipam_type(config, required=True)
            if netns_fd is not None:
                validate_netns_fd(netns_fd, env.netns)
            req = Request(
                env=env,
                config=config,
                netns_fd=netns_fd,
                raw_env=dict(env_vars),
                raw_config=bytes(stdin),
            )
            plugin = self._plugin(plugin_name)
            stdout = self._run(plugin, req)
            reply = {"stdout": stdout, "exit": 0}
        except CNIError as err:
            reply = {"stdout": err.to_json(version), "exit": 1}
        except Exception as exc:  # a bug: never a traceback on stdout, always one in the log
            log.exception("internal error")
            err = InternalError("internal error in pycnid", f"{exc.__class__.__name__}: {exc}")
            reply = {"stdout": err.to_json(version), "exit": 1}
        seconds = time.monotonic() - started
        command = str(env_vars.get("CNI_COMMAND", ""))
        self.requests.inc(
            plugin=plugin_name,
            command=command,
            code=str(json.loads(reply["stdout"]).get("code", 999)) if reply["exit"] else "0",
        )
        self.latency.observe(seconds, plugin=plugin_name, command=command)
        self._log(plugin_name, env_vars, req, reply, seconds)
        return reply["exit"], reply["stdout"]

    def _plugin(self, name: str) -> Any:
        plugin = self.plugins.get(name)
        if plugin is None:
            raise InvalidConfig(
                f"pycnid serves no plugin {name!r}",
                f"served plugins: {', '.join(sorted(self.plugins))}",
            )
        return plugin

    def _run(self, plugin: Any, req: Request) -> str:
        command = req.command
        if command == "GC":
            with self.locks.exclusive():
                plugin.gc(req)
            return ""
        if command == "STATUS":
            plugin.status(req)
            return ""
        with self.locks.attachment((req.env.container_id, req.env.ifname)):
            if command == "ADD":
                return json.dumps(render(plugin.add(req), req.version))
            if command == "DEL":
                plugin.delete(req)
            else:
                plugin.check(req)
        return ""

    def _log(
        self, plugin: str, env: Mapping[str, str], req: Request | None, reply: dict, seconds: float
    ) -> None:
        level = logging.WARNING if reply["exit"] else logging.INFO
        if not log.isEnabledFor(level):  # one line a request, built only when it is written
            return
        fields = {
            "plugin": plugin,
            "command": env.get("CNI_COMMAND"),
            "containerID": env.get("CNI_CONTAINERID"),
            "ifname": env.get("CNI_IFNAME"),
            "network": req.network if req and req.command != "VERSION" else None,
            "exit": reply["exit"],
            "ms": round(seconds * 1000, 2),
        }
        if reply["exit"]:
            try:
                fields["error"] = json.loads(reply["stdout"])
            except ValueError:
                fields["error"] = reply["stdout"]
            log.warning("request failed", extra={"fields": fields})
        else:
            log.info("request served", extra={"fields": fields})

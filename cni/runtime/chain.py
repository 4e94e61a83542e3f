"""ADD/CHECK/DEL/GC/STATUS over a network configuration list, as libcni does.

ADD runs the plugins in order, each given the previous result, stops at the first error and
caches the final result; DEL runs them in reverse with the cached result (corrupt cache →
no prevResult, file removed), then removes the cache entry; CHECK (list ≥ 0.4.0, unless
`disableCheck`) runs them in order with the cached result; GC DELs every cached attachment
of the network that is not in the valid list, then (list ≥ 1.1.0) sends GC to every plugin,
continuing past errors; STATUS (list ≥ 1.1.0) stops at the first failing plugin.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from cni.runtime import cache
from cni.runtime.conflist import NetworkConfigList, PluginConf
from cni.runtime.errors import PluginFailed, join_errors
from cni.runtime.inject import RuntimeConf, build_gc_config, build_one_config, build_status_config
from cni.runtime.invoke import Invocation, decode_result, exec_plugin, find_in_path
from cni.spec.envcheck import check_ifname, valid_id
from cni.spec.errors import (
    CNIError,
    IncompatibleVersion,
    InvalidConfig,
    InvalidEnvironment,
    IOFailure,
    UnknownContainer,
)
from cni.spec.versions import parse_version

log = logging.getLogger("pycni.runtime")


def version_at_least(version: str, minimum: str) -> bool:
    """A missing version is 0.1.0 (spec); an invalid one is a decoding error (code 6)."""
    return parse_version(version or "0.1.0") >= parse_version(minimum)


def validate_attachment(network: str, rt: RuntimeConf) -> None:
    """What libcni checks before ADD: container ID, network name, interface name."""
    if not rt.container_id:
        raise UnknownContainer("missing containerID")
    if not valid_id(rt.container_id):
        raise InvalidEnvironment("invalid characters in containerID", rt.container_id)
    if not valid_id(network):
        raise InvalidConfig("invalid characters found in network name", network)
    problem = check_ifname(rt.ifname)
    if problem:
        raise InvalidEnvironment(problem[1], problem[2])


@dataclass
class Runtime:
    """A libcni-compatible runtime: plugin search path, result cache, inherited environment."""

    path: tuple[str, ...]
    cache_dir: str = cache.DEFAULT_CACHE_DIR
    environ: Mapping[str, str] | None = None  # default: this process's environment
    stderr: IO[str] | None = field(default_factory=lambda: sys.stderr)
    timeout: float | None = None  # libcni has none; the caller's deadline decides

    # -- one plugin ---------------------------------------------------------------------------
    def _invocation(self, command: str, rt: RuntimeConf | None) -> Invocation:
        if rt is None:
            return Invocation(command, path=self.path)
        return Invocation(command, rt.container_id, rt.netns, rt.ifname, rt.args, self.path)

    def _exec(self, plugin: PluginConf, stdin: bytes, inv: Invocation) -> bytes:
        binary = find_in_path(plugin.type, self.path)
        env = inv.as_env(os.environ if self.environ is None else self.environ)
        log.debug("exec %s %s", inv.command, binary)
        return exec_plugin(binary, stdin, env, stderr=self.stderr, timeout=self.timeout)

    def _each(
        self,
        conf: NetworkConfigList,
        verb: str,
        plugins: list[tuple[int, PluginConf]],
        stdin_for: Callable[[PluginConf], bytes],
        rt: RuntimeConf | None,
    ) -> list[bytes]:
        outputs = []
        for index, plugin in plugins:
            try:
                outputs.append(self._exec(plugin, stdin_for(plugin), self._invocation(verb, rt)))
            except CNIError as exc:
                raise PluginFailed(exc, plugin.type, verb, index, len(conf.plugins)) from None
        return outputs

    # -- the verbs ----------------------------------------------------------------------------
    def add_network_list(self, conf: NetworkConfigList, rt: RuntimeConf) -> dict[str, Any]:
        validate_attachment(conf.name, rt)
        result: dict[str, Any] | None = None
        for index, plugin in enumerate(conf.plugins):
            prev = None if result is None else cache.result_as_version(result, conf.cni_version)
            stdin = build_one_config(conf.name, conf.cni_version, plugin, prev, rt)
            try:
                out = self._exec(plugin, stdin, self._invocation("ADD", rt))
                result = decode_result(out, conf.cni_version)
            except CNIError as exc:
                raise PluginFailed(exc, plugin.type, "ADD", index, len(conf.plugins)) from None
        assert result is not None
        self.cache_result(conf, rt, result)
        return result

    def cache_result(self, conf: NetworkConfigList, rt: RuntimeConf, result: dict) -> str:
        entry = cache.CacheEntry(
            container_id=rt.container_id,
            ifname=rt.ifname,
            network_name=conf.name,
            config=conf.raw,
            netns=rt.netns,
            cni_args=rt.args or None,
            capability_args=dict(rt.capability_args) or None,
            result=result,
        )
        try:
            return cache.write_cached(self.cache_dir, entry)
        except OSError as exc:
            raise IOFailure(
                f"failed to set network {conf.name!r} cached result",
                f"{cache.results_dir(self.cache_dir)}: {exc.strerror or exc}",
            ) from None

    def cached_result(self, conf: NetworkConfigList, rt: RuntimeConf) -> dict[str, Any] | None:
        return cache.read_cached_result(
            self.cache_dir, conf.name, rt.container_id, rt.ifname, conf.cni_version or "0.1.0"
        )

    def check_network_list(self, conf: NetworkConfigList, rt: RuntimeConf) -> None:
        if not version_at_least(conf.cni_version, "0.4.0"):
            raise IncompatibleVersion(
                f'configuration version "{conf.cni_version}" does not support the CHECK command',
                "CHECK needs cniVersion 0.4.0 or later",
            )
        if conf.disable_check:
            return
        prev = self.cached_result(conf, rt)
        self._each(
            conf,
            "CHECK",
            list(enumerate(conf.plugins)),
            lambda p: build_one_config(conf.name, conf.cni_version, p, prev, rt),
            rt,
        )

    def del_network_list(self, conf: NetworkConfigList, rt: RuntimeConf) -> None:
        prev = None
        if version_at_least(conf.cni_version, "0.4.0"):
            try:
                prev = self.cached_result(conf, rt)
            except cache.CorruptCache as exc:
                log.warning("ignoring corrupt cache entry: %s", exc)
                self._remove_cached(conf, rt)
        reverse = list(enumerate(conf.plugins))[::-1]
        self._each(
            conf,
            "DEL",
            reverse,
            lambda p: build_one_config(conf.name, conf.cni_version, p, prev, rt),
            rt,
        )
        self._remove_cached(conf, rt)

    def _remove_cached(self, conf: NetworkConfigList, rt: RuntimeConf) -> None:
        try:
            cache.remove_cached(self.cache_dir, conf.name, rt.container_id, rt.ifname)
        except (CNIError, OSError) as exc:
            log.warning("cannot remove cache entry: %s", exc)

    def gc_network_list(
        self, conf: NetworkConfigList, valid: list[tuple[str, str]] | None = None
    ) -> None:
        """`valid` = attachments still in use; None (cnitool's gc) means none is."""
        if conf.disable_gc:
            return
        errors = self._delete_stale(conf, set(valid or ()))
        if version_at_least(conf.cni_version, "1.1.0"):
            for index, plugin in enumerate(conf.plugins):
                try:
                    self._each(
                        conf,
                        "GC",
                        [(index, plugin)],
                        lambda p: build_gc_config(conf.name, conf.cni_version, p, valid),
                        None,
                    )
                except CNIError as exc:
                    errors.append(exc)
        error = join_errors(errors)
        if error is not None:
            raise error

    def _delete_stale(
        self, conf: NetworkConfigList, valid: set[tuple[str, str]]
    ) -> list[CNIError]:
        errors: list[CNIError] = []
        for entry in cache.cached_attachments(self.cache_dir):
            if entry.network_name != conf.name or (entry.container_id, entry.ifname) in valid:
                continue
            rt = RuntimeConf(
                entry.container_id,
                entry.netns,
                entry.ifname,
                entry.cni_args or (),
                entry.capability_args or {},
            )
            try:
                self.del_network_list(conf, rt)
            except CNIError as exc:
                exc.msg = (
                    f"failed to delete stale attachment {rt.container_id} {rt.ifname}: {exc.msg}"
                )
                errors.append(exc)
        return errors

    def status_network_list(self, conf: NetworkConfigList) -> None:
        if not version_at_least(conf.cni_version, "1.1.0"):
            return
        self._each(
            conf,
            "STATUS",
            list(enumerate(conf.plugins)),
            lambda p: build_status_config(conf.name, conf.cni_version, p),
            None,
        )

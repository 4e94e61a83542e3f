"""What a runtime adds to each plugin object before it goes on stdin.

Pure functions. `name` and `cniVersion` of the list always; `prevResult` when there is one;
`runtimeConfig` holding only the capabilities the plugin declares `true` *and* the runtime
supplied (omitted when empty, replacing any `runtimeConfig` in the file, as libcni's
InjectConf does). Keys are serialised sorted, as Go's encoding/json does with a map.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cni.runtime.conflist import PluginConf

GC_KEYS = ("cni.dev/valid-attachments", "cni.dev/attachments")


@dataclass(frozen=True)
class RuntimeConf:
    """libcni's RuntimeConf: one attachment's arguments besides the network config."""

    container_id: str
    netns: str
    ifname: str
    args: tuple[tuple[str, str], ...] = ()
    capability_args: Mapping[str, Any] = field(default_factory=dict)


def calc_runtime_config(plugin: PluginConf, capability_args: Mapping[str, Any]) -> dict[str, Any]:
    return {
        cap: capability_args[cap]
        for cap, enabled in plugin.capabilities.items()
        if enabled is True and cap in capability_args
    }


def render_config(raw: Mapping[str, Any], inject: Mapping[str, Any]) -> bytes:
    return json.dumps({**raw, **inject}, sort_keys=True, separators=(",", ":")).encode()


def build_one_config(
    name: str,
    cni_version: str,
    plugin: PluginConf,
    prev_result: Mapping[str, Any] | None,
    rt: RuntimeConf,
) -> bytes:
    """stdin for ADD/DEL/CHECK of one plugin of the list."""
    inject: dict[str, Any] = {"name": name, "cniVersion": cni_version}
    if prev_result is not None:
        inject["prevResult"] = prev_result
    runtime_config = calc_runtime_config(plugin, rt.capability_args)
    if runtime_config:
        inject["runtimeConfig"] = runtime_config
    return render_config(plugin.raw, inject)


def build_gc_config(
    name: str, cni_version: str, plugin: PluginConf, valid: list[tuple[str, str]] | None
) -> bytes:
    """stdin for GC: both attachment keys (spec 1.1.0 and the renamed one), or neither when
    the caller passes no list (cnitool's gc: nothing is valid)."""
    inject: dict[str, Any] = {"name": name, "cniVersion": cni_version}
    if valid is not None:
        items = [{"containerID": cid, "ifname": ifname} for cid, ifname in valid]
        inject.update({key: items for key in GC_KEYS})
    return render_config(plugin.raw, inject)


def build_status_config(name: str, cni_version: str, plugin: PluginConf) -> bytes:
    return render_config(plugin.raw, {"name": name, "cniVersion": cni_version})

"""Loading network configuration lists the way libcni does.

`load_network_conf(dir, name)`: `*.conflist` files sorted lexically, the first whose `name`
matches (a file that fails to parse fails the whole lookup, as in libcni); else a legacy
single-plugin `.conf`/`.json` is up-converted to a one-plugin list. Unless
`loadOnlyInlinedPlugins` is true, plugin fragments in `<dir>/<name>/*.conf` are appended.
The three booleans also accept the strings "true"/"false"; `cniVersions` picks the highest
version not newer than the one this runtime implements.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from typing import Any

from cni.spec.errors import DecodingFailure, InvalidConfig
from cni.spec.versions import CURRENT, parse_version

LIST_EXTENSIONS = (".conflist",)
LEGACY_EXTENSIONS = (".conf", ".json")
FRAGMENT_EXTENSIONS = (".conf",)
BOOL_KEYS = ("disableCheck", "disableGC", "loadOnlyInlinedPlugins")


class NetworkNotFound(InvalidConfig):
    """No configuration file of that network name (code 7)."""


@dataclass(frozen=True)
class PluginConf:
    """One plugin object of a list: its JSON as loaded (injection happens per call)."""

    raw: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.raw["type"])

    @property
    def capabilities(self) -> dict[str, Any]:
        caps = self.raw.get("capabilities")
        return caps if isinstance(caps, dict) else {}


@dataclass(frozen=True)
class NetworkConfigList:
    name: str
    cni_version: str
    plugins: tuple[PluginConf, ...]
    raw: bytes  # the list's bytes as read; cached with each attachment (libcni `config`)
    disable_check: bool = False
    disable_gc: bool = False
    load_only_inlined_plugins: bool = False
    source: str = field(default="", compare=False)  # the file it came from, for messages


def _decode_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodingFailure(f"error parsing {what}", str(exc)) from None
    if not isinstance(value, dict):
        raise DecodingFailure(f"error parsing {what}", "expected a JSON object")
    return value


def plugin_conf_from_dict(raw: Any, what: str) -> PluginConf:
    if not isinstance(raw, dict):
        raise InvalidConfig(f"invalid {what}", "a plugin configuration must be a JSON object")
    if not isinstance(raw.get("type"), str) or not raw["type"]:
        raise InvalidConfig(f"invalid {what}", "missing 'type'")
    return PluginConf(raw)


def read_bool(raw: dict[str, Any], key: str) -> bool:
    """A boolean key, also accepting the strings "true"/"false" (any case)."""
    value = raw.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise InvalidConfig(f"invalid value {value!r} for {key}", "expected true or false")


def calc_cni_version(raw: dict[str, Any]) -> str:
    """`cniVersion`, or with `cniVersions` the highest listed version this runtime implements."""
    version = raw.get("cniVersion", "")
    if not isinstance(version, str):
        raise InvalidConfig("invalid cniVersion", f"{version!r} is not a string")
    versions = raw.get("cniVersions")
    if versions is None:
        return version
    if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
        raise InvalidConfig("invalid cniVersions", "expected a list of version strings")
    candidates = [*versions, *([version] if version else [])]
    usable = [v for v in candidates if parse_version(v) <= parse_version(CURRENT)]
    return max(usable, key=parse_version) if usable else version


def conflist_from_bytes(data: bytes, source: str = "") -> NetworkConfigList:
    """Parse a conflist (without fragments). `plugins` may be absent unless
    `loadOnlyInlinedPlugins` is true; fragments may supply them."""
    raw = _decode_object(data, f"configuration list {source}".strip())
    name = raw.get("name")
    if not isinstance(name, str):
        raise InvalidConfig("error parsing configuration list: missing or invalid 'name'", source)
    inlined_only = read_bool(raw, "loadOnlyInlinedPlugins")
    plugins = raw.get("plugins")
    if plugins is None and inlined_only:
        raise InvalidConfig("loadOnlyInlinedPlugins is true and there is no 'plugins' key", source)
    if plugins is not None and (not isinstance(plugins, list) or not plugins):
        raise InvalidConfig("invalid 'plugins'", "expected a non-empty list of plugin objects")
    return NetworkConfigList(
        name=name,
        cni_version=calc_cni_version(raw),
        raw=data,
        source=source,
        plugins=tuple(
            plugin_conf_from_dict(p, f"plugin config {i}") for i, p in enumerate(plugins or [])
        ),
        disable_check=read_bool(raw, "disableCheck"),
        disable_gc=read_bool(raw, "disableGC"),
        load_only_inlined_plugins=inlined_only,
    )


def conf_files(directory: str, extensions: tuple[str, ...]) -> list[str]:
    """Regular files in `directory` with one of `extensions`, sorted; none if it is missing."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    return [
        os.path.join(directory, n)
        for n in names
        if os.path.splitext(n)[1] in extensions and not os.path.isdir(os.path.join(directory, n))
    ]


def read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise InvalidConfig(f"error reading {path}", exc.strerror or str(exc)) from None


def plugin_fragments(conf_dir: str, name: str) -> list[PluginConf]:
    """Plugin objects from `<conf_dir>/<name>/*.conf`."""
    return [
        plugin_conf_from_dict(_decode_object(read_file(path), path), path)
        for path in conf_files(os.path.join(conf_dir, name), FRAGMENT_EXTENSIONS)
    ]


def conflist_from_file(path: str) -> NetworkConfigList:
    conf = conflist_from_bytes(read_file(path), path)
    if not conf.load_only_inlined_plugins:
        extra = plugin_fragments(os.path.dirname(path), conf.name)
        conf = replace(conf, plugins=conf.plugins + tuple(extra))
    if not conf.plugins:
        raise InvalidConfig(f"no plugin configs found for network {conf.name!r}", path)
    return conf


def conflist_from_conf(raw: dict[str, Any], source: str = "") -> NetworkConfigList:
    """Up-convert a legacy single-plugin config into a one-plugin list."""
    plugin_conf_from_dict(raw, source or "network config")
    data = json.dumps(
        {"cniVersion": raw.get("cniVersion", ""), "name": raw.get("name", ""), "plugins": [raw]},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    return conflist_from_bytes(data, source)


def load_legacy_conf(conf_dir: str, name: str) -> NetworkConfigList | None:
    for path in conf_files(conf_dir, LEGACY_EXTENSIONS):
        raw = _decode_object(read_file(path), path)
        plugin_conf_from_dict(raw, path)
        if raw.get("name") == name:
            return conflist_from_conf(raw, path)
    return None


def load_network_conf(conf_dir: str, name: str) -> NetworkConfigList:
    """libcni's LoadNetworkConf(dir, name)."""
    lists = conf_files(conf_dir, LIST_EXTENSIONS)
    for path in lists:
        conf = conflist_from_file(path)
        if conf.name == name:
            return conf
    legacy = load_legacy_conf(conf_dir, name)
    if legacy is not None:
        return legacy
    if not lists and not conf_files(conf_dir, LEGACY_EXTENSIONS):
        raise NetworkNotFound(
            f"no net configurations found in {conf_dir}",
            "set NETCONFPATH to the directory holding your .conflist files",
        )
    raise NetworkNotFound(
        f'no net configuration with name "{name}" in {conf_dir}',
        f"files looked at: {', '.join(_basenames(conf_dir)) or '(none)'}",
    )


def _basenames(conf_dir: str) -> list[str]:
    return [os.path.basename(p) for p in conf_files(conf_dir, LIST_EXTENSIONS + LEGACY_EXTENSIONS)]

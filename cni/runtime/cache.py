"""The result cache, byte-compatible with libcni's (`cniCacheV1`).

After a whole-list ADD the runtime writes `<cacheDir>/results/<net>-<containerID>-<ifname>`
(dir 0700, file 0600) holding the list's bytes, the runtime arguments and the final result;
DEL/CHECK read it back as prevResult converted to the list's version, GC lists it. A Go
runtime (containerd, cnitool) and `pycni net` can therefore read each other's entries.
Field names and encodings follow libcni's `cachedInfo` (`config` is base64, `cniArgs` a list
of [key, value] pairs); a file that is not `cniCacheV1` is read as a legacy bare result.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass
from typing import Any

from cni.files import write_atomic
from cni.spec.errors import CNIError, DecodingFailure, InvalidConfig
from cni.spec.result import canonical, render
from cni.spec.versions import SUPPORTED

DEFAULT_CACHE_DIR = "/var/lib/cni"
KIND = "cniCacheV1"


class CorruptCache(DecodingFailure):
    """A cache file that cannot be read back (code 6)."""


@dataclass(frozen=True)
class CacheEntry:
    container_id: str
    ifname: str
    network_name: str
    config: bytes = b""
    netns: str = ""
    cni_args: tuple[tuple[str, str], ...] | None = None
    capability_args: dict[str, Any] | None = None
    result: dict[str, Any] | None = None

    def to_json(self) -> bytes:
        """libcni's field order and omitempty rules."""
        out: dict[str, Any] = {
            "kind": KIND,
            "containerId": self.container_id,
            "config": base64.b64encode(self.config).decode(),
            "ifName": self.ifname,
            "networkName": self.network_name,
        }
        if self.netns:
            out["netns"] = self.netns
        if self.cni_args:
            out["cniArgs"] = [list(pair) for pair in self.cni_args]
        if self.capability_args:
            out["capabilityArgs"] = self.capability_args
        if self.result:
            out["result"] = self.result
        return json.dumps(out, separators=(",", ":")).encode()


def results_dir(cache_dir: str) -> str:
    return os.path.join(cache_dir, "results")


def cache_file(cache_dir: str, network: str, container_id: str, ifname: str) -> str:
    if not network or not container_id or not ifname:
        raise InvalidConfig(
            "cache file path requires network name, container ID and interface name",
            f"got {network!r}, {container_id!r}, {ifname!r}",
        )
    return os.path.join(results_dir(cache_dir), f"{network}-{container_id}-{ifname}")


def write_cached(cache_dir: str, entry: CacheEntry) -> str:
    """Write one entry atomically (temp file + rename), file 0600 in a 0700 directory."""
    path = cache_file(cache_dir, entry.network_name, entry.container_id, entry.ifname)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    write_atomic(path, entry.to_json(), 0o600)
    return path


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def remove_cached(cache_dir: str, network: str, container_id: str, ifname: str) -> None:
    _unlink(cache_file(cache_dir, network, container_id, ifname))


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None  # as libcni: an unreadable cache is no cache


def _decode(data: bytes, path: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptCache(f"cached result {path} is not JSON", str(exc)) from None


def entry_from_dict(data: dict[str, Any], path: str = "") -> CacheEntry:
    """A cniCacheV1 object -> CacheEntry (CorruptCache when fields have the wrong types)."""
    try:
        args = data.get("cniArgs")
        return CacheEntry(
            container_id=str(data.get("containerId", "")),
            ifname=str(data.get("ifName", "")),
            network_name=str(data.get("networkName", "")),
            netns=str(data.get("netns", "")),
            config=base64.b64decode(data.get("config") or "", validate=True),
            cni_args=None if args is None else tuple((str(k), str(v)) for k, v in args),
            capability_args=_dict_or_none(data.get("capabilityArgs")),
            result=_dict_or_none(data.get("result")),
        )
    except (TypeError, ValueError, binascii.Error) as exc:
        raise CorruptCache(f"cached entry {path} is malformed", str(exc)) from None


def _dict_or_none(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value


def read_cached_entry(
    cache_dir: str, network: str, container_id: str, ifname: str
) -> CacheEntry | None:
    """The entry, None when there is none; CorruptCache when the file is not a v1 entry."""
    path = cache_file(cache_dir, network, container_id, ifname)
    data = _read(path)
    if data is None:
        return None
    value = _decode(data, path)
    if not isinstance(value, dict) or value.get("kind") != KIND:
        raise CorruptCache(f"cached entry {path} is not {KIND}")
    return entry_from_dict(value, path)


def read_cached_result(
    cache_dir: str, network: str, container_id: str, ifname: str, version: str
) -> dict[str, Any] | None:
    """The cached result converted to `version`; None when nothing is cached.

    A non-v1 file is read as a legacy bare result (as libcni does). Raises CorruptCache when
    the file cannot be read back or converted."""
    path = cache_file(cache_dir, network, container_id, ifname)
    data = _read(path)
    if data is None:
        return None
    value = _decode(data, path)
    if isinstance(value, dict) and value.get("kind") == KIND:
        value = entry_from_dict(value, path).result
    if value is None:
        return None
    try:
        return result_as_version(value, version)
    except CNIError as exc:
        raise CorruptCache(
            f"cannot convert cached result {path} to version {version}", str(exc)
        ) from None


def result_as_version(result: Any, version: str) -> dict[str, Any]:
    """A result in `version`: verbatim when it already is (a result without `cniVersion` is
    taken as `version`), else converted (`cni.spec.result`). DecodingFailure when it is not
    a well-formed result or either version is one pycni cannot convert."""
    if not isinstance(result, dict):
        raise DecodingFailure("result is not a JSON object", f"got {type(result).__name__}")
    have = str(result.get("cniVersion") or version)
    parsed = canonical(result, have, where="cached result")
    if have == version:
        return {**result, "cniVersion": version}
    if have not in SUPPORTED or version not in SUPPORTED:
        raise DecodingFailure(
            f"cannot convert a {have} result to {version}",
            f"supported versions: {', '.join(SUPPORTED)}",
        )
    return render(parsed, version)


def cached_attachments(cache_dir: str) -> list[CacheEntry]:
    """Every readable v1 entry (sorted by file name); others are skipped, as in libcni."""
    directory = results_dir(cache_dir)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        data = _read(os.path.join(directory, name))
        try:
            value = json.loads(data) if data is not None else None
            if isinstance(value, dict) and value.get("kind") == KIND:
                entry = entry_from_dict(value)
                if entry.ifname and entry.network_name:
                    found.append(entry)
        except (ValueError, CorruptCache):
            continue
    return found

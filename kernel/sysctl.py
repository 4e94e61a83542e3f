"""/proc/sys/net knobs of the calling thread's netns (per-thread after ``ns.entered``)."""

from __future__ import annotations

import os

ROOT = "/proc/sys"


def sysctl_path(name: str) -> str:
    """'net.ipv4.ip_forward' or 'net/ipv4/ip_forward' -> '/proc/sys/net/ipv4/ip_forward'.

    Dotted names cannot address interfaces whose name holds a dot; use slashes for those.
    """
    return os.path.join(ROOT, name if "/" in name else name.replace(".", "/"))


def read_sysctl(name: str) -> str | None:
    """The value, or None when the knob does not exist (e.g. IPv6 disabled)."""
    try:
        with open(sysctl_path(name), encoding="ascii") as fh:
            return fh.read().strip()
    except FileNotFoundError:
        return None


def write_sysctl(name: str, value: str) -> None:
    with open(sysctl_path(name), "w", encoding="ascii") as fh:
        fh.write(value)


def ensure_sysctl(name: str, value: str, *, missing_ok: bool = False) -> bool:
    """Set ``name`` to ``value`` unless it already is; True when it was written.

    A knob that does not exist is an error unless ``missing_ok``.
    """
    current = read_sysctl(name)
    if current is None:
        if missing_ok:
            return False
        raise FileNotFoundError(f"sysctl {name} does not exist")
    if current == value:
        return False
    write_sysctl(name, value)
    return True

"""A DEL netconf cut down to what DEL needs, for a request over the transport's limit.

DEL releases what an attachment holds, found by network name, container ID and ifname: the
bulk a runtime may send with it (prevResult, runtimeConfig, args, unknown keys) is not needed.
A DEL a runtime cannot get through is retried for ever, so the executable sends this instead of
refusing. Standard library only (the executable's slow path).
"""

from __future__ import annotations

import json

# what a pycni plugin reads on DEL; `ipam` is cut to its `type` when even it is too large
DEL_KEYS = ("cniVersion", "name", "type", "daemonSocket", "ipam")


def netconf_for_del(stdin: bytes, budget: int) -> bytes | None:
    """The netconf with only DEL_KEYS, in at most `budget` bytes; None if it cannot be."""
    try:
        config = json.loads(stdin)
    except (ValueError, RecursionError):
        return None
    if not isinstance(config, dict):
        return None
    kept = {key: config[key] for key in DEL_KEYS if key in config}
    for candidate in (kept, with_ipam_type_only(kept)):
        data = encode(candidate)
        if data is not None and len(data) <= budget:
            return data
    return None


def with_ipam_type_only(config: dict) -> dict:
    ipam = config.get("ipam")
    if not isinstance(ipam, dict):
        return {key: value for key, value in config.items() if key != "ipam"}
    return {**config, "ipam": {"type": ipam["type"]} if "type" in ipam else {}}


def encode(config: dict) -> bytes | None:
    try:
        return json.dumps(config).encode()
    except (ValueError, RecursionError):
        return None

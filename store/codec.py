"""The record codec: every record in the store is one JSON object (pure, no I/O).

Encoding is canonical (sorted keys, no spaces), so equal records are equal bytes. Records
keep fields they do not know (each record type's ``extra``), so a newer pycnid writing more
fields is not undone by an older one, nor by ``pycni ipam``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cni.spec.errors import InternalError


class CorruptRecord(InternalError, ValueError):
    """A stored value that is not a usable record (``details`` says why)."""


def encode(data: Mapping[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


def decode(key: str, value: bytes) -> dict:
    """A record's JSON; a corrupt record is an internal error naming its key."""
    try:
        data = json.loads(value)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CorruptRecord(f"corrupt IPAM record {key}", f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CorruptRecord(f"corrupt IPAM record {key}", "not a JSON object")
    return data

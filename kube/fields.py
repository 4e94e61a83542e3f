"""Reading fields of API objects (raw JSON): a missing or null field is empty, a field of the
wrong type is a ValueError naming it (the reflector then leaves the object out, logged once)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def section(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{key} is not an object")
    return value


def entries(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{key} is not a list")
    return value

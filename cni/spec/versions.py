"""Which CNI spec versions pycni speaks, and what each one allows."""

from __future__ import annotations

from cni.spec.errors import DecodingFailure, IncompatibleVersion

CURRENT = "1.1.0"
SUPPORTED = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
# Verbs that a version must reach to be asked.
MIN_VERSION = {"CHECK": "0.4.0", "STATUS": "1.1.0", "GC": "1.1.0"}


def parse_version(text: str) -> tuple[int, int, int]:
    """'1.0.0' -> (1, 0, 0); anything else is a decoding failure (code 6)."""
    parts = text.split(".") if isinstance(text, str) else []
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() and len(p) < 10 for p in parts):
        raise DecodingFailure(f"invalid version {text!r}", "a CNI version looks like 1.0.0")
    return int(parts[0]), int(parts[1]), int(parts[2])


def at_least(version: str, minimum: str) -> bool:
    return parse_version(version) >= parse_version(minimum)


def validate_version(version: str, command: str) -> None:
    """Refuse a version pycni cannot answer in, or one too old for the verb (code 1)."""
    parse_version(version)
    if version not in SUPPORTED:
        raise IncompatibleVersion(
            "incompatible CNI versions",
            f"config is {version!r}, plugin supports {list(SUPPORTED)}",
        )
    minimum = MIN_VERSION.get(command)
    if minimum and not at_least(version, minimum):
        raise IncompatibleVersion(
            f"config version does not allow {command}",
            f"{command} needs cniVersion {minimum} or later, config is {version}",
        )


def version_info(requested: str | None = None) -> dict:
    """The VERSION verb's answer."""
    return {
        "cniVersion": requested if requested in SUPPORTED else CURRENT,
        "supportedVersions": list(SUPPORTED),
    }

"""Are pyproject.toml's Python requirements installed? (scripts/install-deps.sh asks, to skip pip.)

    python3 scripts/python_deps.py [EXTRA ...]

Exit 0 when every requirement in ``[project] dependencies`` and in the named optional extras
is installed for this interpreter at a version the requirement allows; else exit 1, naming on
stdout what is missing or too old. Reads installed metadata only (no imports: ~0.1 s), standard
library only (it runs before anything is installed). A requirement it cannot judge (markers,
an operator other than ``>=`` and ``==``) counts as missing: pip decides.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
import tomllib

PYPROJECT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml"
)
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:(>=|==)\s*([0-9][0-9.]*))?\s*$")


def requirements(extras: list[str]) -> list[str]:
    with open(PYPROJECT, "rb") as fh:
        project = tomllib.load(fh)["project"]
    optional = project.get("optional-dependencies", {})
    return [*project.get("dependencies", []), *(r for e in extras for r in optional.get(e, []))]


def release(version: str) -> tuple[int, ...]:
    """'1.0.2.post1' -> (1, 0, 2); '0.9rc1' -> (0, 9)."""
    parts = []
    for piece in version.split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.end() != len(piece):
            break
    return tuple(parts)


def older(have: tuple[int, ...], need: tuple[int, ...]) -> bool:
    width = max(len(have), len(need))
    return have + (0,) * (width - len(have)) < need + (0,) * (width - len(need))


def unmet(requirement: str) -> str | None:
    """None when installed at an allowed version; else why not."""
    match = REQUIREMENT.match(requirement)
    if match is None:
        return f"{requirement} (not judged here)"
    name, operator, wanted = match.groups()
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return f"{name} (not installed)"
    if operator == "==" and release(installed) != release(wanted):
        return f"{name} {installed} (needs == {wanted})"
    if operator == ">=" and older(release(installed), release(wanted)):
        return f"{name} {installed} (needs >= {wanted})"
    return None


def main(extras: list[str]) -> int:
    missing = [why for why in map(unmet, requirements(extras)) if why]
    for why in missing:
        print(why)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

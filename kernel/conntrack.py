"""The ``conntrack`` tool (conntrack-tools), run in the caller's netns: mechanism only."""

from __future__ import annotations

import logging
import subprocess

log = logging.getLogger("pycnid")


def run_conntrack(args: list[str], who: str) -> str:
    """The tool's output; an empty string when it finds nothing (it exits 1 then) or cannot
    run (logged as ``who``'s warning)."""
    try:
        done = subprocess.run(["conntrack", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("%s: conntrack %s failed: %s", who, " ".join(args), exc)
        return ""
    return done.stdout

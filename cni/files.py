"""Files written whole or not at all (standard library only: the launchers and the installer
run without pycni's dependencies)."""

from __future__ import annotations

import os
import tempfile


def write_atomic(path: str, data: bytes, mode: int, durable: bool = False) -> None:
    """Write ``path`` through a temp file in its directory renamed over it, so a reader sees
    the old content or the new, never a part. The temp file is created 0600 and given
    ``mode`` only once complete; it is removed when anything fails. ``durable``: flushed to
    disk before the rename (a crash then leaves the old file or the whole new one)."""
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory or ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise

"""Files written whole or not at all, and the modes of pycni's state: files 0600, directories
0700 (standard library only: the launchers and the installer run without pycni's
dependencies)."""

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


PRIVATE_FILE, PRIVATE_DIR = 0o600, 0o700  # pycni's state: root's alone


def make_private_dirs(path: str) -> None:
    """Create ``path`` and each missing parent 0700 (``os.makedirs`` gives its ``mode`` to the
    last one only). Directories that exist keep their mode: they may not be pycni's."""
    if not path or os.path.isdir(path):
        return
    make_private_dirs(os.path.dirname(path.rstrip("/")))
    try:
        os.mkdir(path, PRIVATE_DIR)
    except FileExistsError:  # made meanwhile by another process
        pass


def create_private(path: str) -> None:
    """Create ``path`` empty and 0600 when it is missing; a file that exists is left as is
    (and not opened: on a read-only file system it stays readable)."""
    if os.path.exists(path):
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE))
    except FileExistsError:  # made meanwhile by another process
        pass


def tighten_modes(paths: list[str]) -> list[str]:
    """Take group and other permissions off each existing file of ``paths`` (state written by
    an older pycni); the paths that changed, as ``path (0644)`` with the old mode."""
    changed = []
    for path in paths:
        try:
            mode = os.stat(path).st_mode & 0o777
        except FileNotFoundError:
            continue
        if mode & 0o077:
            os.chmod(path, mode & 0o700)
            changed.append(f"{path} ({mode:04o})")
    return changed

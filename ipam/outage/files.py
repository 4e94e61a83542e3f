"""The outage buffer's local files under stateDir: a journal and a buffer snapshot.

``<stateDir>/ipam-outage/<node>.journal``  one JSON object per line, appended and fsync'd
    before the ADD/DEL it records is answered: {"seq", "op": "add"|"del", "at", "handle":
    {network, containerID, ifname}, "record": <handle record> (add only)}. A torn last line
    (a crash mid-append: that request was never answered) is ignored.
``<stateDir>/ipam-outage/<node>.buffer.json``  {pool: [leased ip, ...]}: the node's buffer
    handles as etcd held them at the last sync, replaced atomically (write, fsync, rename,
    fsync the directory).

After a restart the addresses a node may still hand out during an outage are the snapshot's
minus every address an ``add`` entry of the journal names. Crash safety relies on the order the
reconciler keeps: snapshot first, then the journal shortened.

Both files are 0600 in 0700 directories (``cni.files``); ``tighten()`` takes group and other
permissions off files an older pycni wrote, once at start.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from cni.files import PRIVATE_FILE, make_private_dirs, tighten_modes, write_atomic
from cni.spec.errors import TryAgainLater

log = logging.getLogger("pycnid.outage")


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str, data: bytes) -> None:
    write_atomic(path, data, PRIVATE_FILE, durable=True)
    fsync_dir(os.path.dirname(path))


def append_durably(path: str, line: str) -> None:
    """Append ``line`` and fsync it; the file is created 0600 when missing."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def parse_lines(text: str, path: str) -> tuple[list[dict], bool]:
    """The entries, and whether a line other than a torn last one was unreadable."""
    entries, corrupt = [], False
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            if number == len(lines):  # torn last line: its request was never answered
                log.warning("ignoring the torn last line of %s", path)
            else:
                log.error("unreadable line %d in %s", number, path)
                corrupt = True
            continue
        if isinstance(entry, dict) and entry.get("op") in ("add", "del"):
            entries.append(entry)
        else:
            log.error("unexpected entry on line %d of %s", number, path)
            corrupt = True
    return entries, corrupt


class OutageFiles:
    def __init__(self, state_dir: str, node: str) -> None:
        self.dir = os.path.join(state_dir, "ipam-outage")
        safe = node.replace("/", "_")
        self.journal_path = os.path.join(self.dir, f"{safe}.journal")
        self.buffer_path = os.path.join(self.dir, f"{safe}.buffer.json")
        self.corrupt = False  # an unreadable entry: what was served is not fully known

    def ensure_dir(self) -> None:
        if not os.path.isdir(self.dir):
            make_private_dirs(self.dir)
            fsync_dir(os.path.dirname(self.dir))

    def tighten(self) -> None:
        """Take group and other permissions off the files (and this module's own directory)
        an older pycni wrote; one warning naming them."""
        if not os.path.isdir(self.dir):
            return
        tightened = tighten_modes([self.dir, self.journal_path, self.buffer_path])
        if tightened:
            log.warning(
                "IPAM outage files were readable by others, now private: %s", ", ".join(tightened)
            )

    def append(self, entry: dict[str, Any]) -> None:
        """Append one entry durably; TryAgainLater when the disk refuses it."""
        line = json.dumps(entry, separators=(",", ":"), sort_keys=True) + "\n"
        try:
            self.ensure_dir()
            created = not os.path.exists(self.journal_path)
            append_durably(self.journal_path, line)
            if created:
                fsync_dir(self.dir)
        except OSError as exc:
            raise TryAgainLater(
                f"cannot write the IPAM outage journal {self.journal_path}", str(exc)
            ) from None

    def entries(self) -> list[dict]:
        try:
            with open(self.journal_path, encoding="utf-8") as fh:
                entries, corrupt = parse_lines(fh.read(), self.journal_path)
        except FileNotFoundError:
            return []
        self.corrupt = self.corrupt or corrupt
        return entries

    def rewrite(self, entries: list[dict]) -> None:
        """Replace the journal by ``entries`` (the ones not replayed yet)."""
        self.ensure_dir()
        text = "".join(
            json.dumps(e, separators=(",", ":"), sort_keys=True) + "\n" for e in entries
        )
        write_atomically(self.journal_path, text.encode())

    def load_buffers(self) -> dict[str, list[dict]]:
        try:
            with open(self.buffer_path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return {}
        except ValueError as exc:  # written atomically, so only a foreign hand breaks it
            log.warning("ignoring the unreadable buffer snapshot %s: %s", self.buffer_path, exc)
            return {}
        return {str(k): list(v) for k, v in data.items() if isinstance(v, list)}

    def save_buffers(self, buffers: dict[str, list[dict]]) -> None:
        self.ensure_dir()
        write_atomically(self.buffer_path, json.dumps(buffers, sort_keys=True).encode())

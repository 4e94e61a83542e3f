"""The embedded store: the Store protocol (``base.Store``) on one SQLite file.

It mimics etcd's data model so the IPAM code runs unchanged on both: one global revision
counter bumped by every write txn, and ``mod_revision``/``create_revision`` per key. Keys are
stored as BLOBs so prefix ranges compare bytewise, exactly like etcd.

pycnid is threaded: one connection, guarded by a lock. Every txn is ``BEGIN IMMEDIATE`` (the
write lock is taken before the compares are read), so a CLI process opening the same file
concurrently is serialised by SQLite itself. WAL with ``synchronous=NORMAL``: a commit survives
a crash of the daemon (SIGKILL); only a power cut may lose the last commits, together with the
containers that held those addresses.

File modes: the database is created 0600 before SQLite opens it, in directories created 0700
(``cni.files``); SQLite gives its ``-wal`` and ``-shm`` files the database file's mode. Files
an older pycni left readable by others (0644) are tightened when the store opens, with one
warning naming them.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence, Set
from contextlib import contextmanager

from cni.files import create_private, make_private_dirs, tighten_modes
from cni.spec.errors import NotAvailable, TryAgainLater
from store.base import KV, Compare, Delete, Op, Put, TxnResult

log = logging.getLogger("pycnid.store")
BUSY_TIMEOUT_MS = 5000
SIDE_FILES = ("-wal", "-shm", "-journal")  # SQLite's own files next to the database
SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key BLOB PRIMARY KEY,
    value BLOB NOT NULL,
    mod_revision INTEGER NOT NULL,
    create_revision INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta (name, value) VALUES ('revision', 1);
"""
UPSERT = (
    "INSERT INTO kv (key, value, mod_revision, create_revision) VALUES (?, ?, ?, ?) "
    "ON CONFLICT(key) DO UPDATE SET value = excluded.value, "
    "mod_revision = excluded.mod_revision"
)


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no bound)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def range_clause(prefix: str) -> tuple[str, tuple[bytes, ...]]:
    start = prefix.encode()
    end = prefix_end(start)
    if end is None:
        return "key >= ?", (start,)
    return "key >= ? AND key < ?", (start, end)


def describe_open_failure(path: str, exc: Exception) -> str:
    """SQLite's reason, with what the directory's filesystem says when that is the cause
    (SQLite reports a read-only or full filesystem as "unable to open database file")."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fs = os.statvfs(directory)
    except OSError:
        return str(exc)
    if fs.f_flag & os.ST_RDONLY:
        return f"{exc}: {directory} is on a read-only filesystem"
    if fs.f_bavail == 0:
        return f"{exc}: no space left on the filesystem of {directory}"
    return str(exc)


class SqliteStore:
    """``Store`` on a SQLite file (created with its directory when missing)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = f"sqlite:{path}"
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = self._open()

    def _open(self) -> sqlite3.Connection:
        try:
            prepare_files(self.path)
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=BUSY_TIMEOUT_MS / 1000,
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            conn.executescript(SCHEMA)
            return conn
        except (sqlite3.Error, OSError) as exc:
            why = describe_open_failure(self.path, exc)
            raise TryAgainLater(f"cannot open the IPAM store {self.name}", why) from None

    @contextmanager
    def _cursor(self) -> Iterator[sqlite3.Connection]:
        """The connection under the lock; any SQLite failure is code 11 naming the store."""
        with self._lock:
            if self._conn is None:
                raise TryAgainLater(f"the IPAM store {self.name} is closed")
            try:
                yield self._conn
            except sqlite3.Error as exc:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise TryAgainLater(f"the IPAM store {self.name} failed", str(exc)) from None

    def get(self, key: str) -> KV | None:
        with self._cursor() as conn:
            row = conn.execute(
                "SELECT key, value, mod_revision, create_revision FROM kv WHERE key = ?",
                (key.encode(),),
            ).fetchone()
        return _kv(row) if row else None

    def range(self, prefix: str, *, keys_only: bool = False, limit: int = 0) -> list[KV]:
        where, params = range_clause(prefix)
        value = "x''" if keys_only else "value"
        sql = (
            f"SELECT key, {value}, mod_revision, create_revision FROM kv WHERE {where} "
            "ORDER BY key"
        )
        if limit > 0:
            sql += f" LIMIT {int(limit)}"
        with self._cursor() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [_kv(row) for row in rows]

    def changes_since(
        self, prefix: str, revision: int, known: Set[str]
    ) -> tuple[list[KV], set[str] | None]:
        """One snapshot of ``prefix`` for a reader that held the keys ``known`` of it at
        ``revision``: the keys written since (with their values), and the keys it holds now,
        or None when that is ``known`` plus those written (no delete: counted, not listed;
        listing 10,000 keys was most of the cost)."""
        where, params = range_clause(prefix)
        columns = "key, value, mod_revision, create_revision"
        with self._cursor() as conn:
            conn.execute("BEGIN")  # one read transaction: every query sees one commit
            try:
                changed = [
                    _kv(row)
                    for row in conn.execute(
                        f"SELECT {columns} FROM kv WHERE {where} AND mod_revision > ? "
                        "ORDER BY key",
                        (*params, revision),
                    )
                ]
                held = len(known) + sum(kv.key not in known for kv in changed)
                count = conn.execute(f"SELECT COUNT(*) FROM kv WHERE {where}", params).fetchone()
                keys = None
                if count[0] != held:
                    rows = conn.execute(f"SELECT key FROM kv WHERE {where}", params)
                    keys = {bytes(row[0]).decode() for row in rows}
            finally:
                conn.execute("COMMIT")
        return changed, keys

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        with self._cursor() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                revision = _current_revision(conn)
                if not _all_hold(conn, compares):
                    conn.execute("ROLLBACK")
                    return TxnResult(False, revision)
                before = conn.total_changes
                for op in ops:
                    _apply(conn, op, revision + 1)
                if conn.total_changes != before:  # like etcd: deleting nothing is no write
                    revision += 1
                    conn.execute("UPDATE meta SET value = ? WHERE name = 'revision'", (revision,))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        return TxnResult(True, revision)

    def revision(self) -> int:
        with self._cursor() as conn:
            return _current_revision(conn)

    def data_version(self) -> int:
        """SQLite's ``PRAGMA data_version``: it changes when another connection (the CLI, another
        process) commits to the file, never for this store's own txns."""
        with self._cursor() as conn:
            return int(conn.execute("PRAGMA data_version").fetchone()[0])

    def release_cache(self) -> None:
        """Give the connection's page cache back (``PRAGMA shrink_memory``). After a whole
        read of a prefix it holds up to SQLite's default 2,000 KiB of pages the next small
        read does not need: a pycnid that read 10,000 endpoint records and 1,000 policies for
        NetworkPolicy kept 1.8 MiB more. Those pages are in the kernel's file cache still."""
        with self._cursor() as conn:
            conn.execute("PRAGMA shrink_memory")

    def status(self) -> None:
        """Prove the store can take the write lock now (a read-only or broken file cannot)."""
        try:
            with self._cursor() as conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("ROLLBACK")
        except TryAgainLater as exc:
            raise NotAvailable(exc.msg, exc.details) from None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def prepare_files(path: str) -> None:
    """The database's directories (0700 when made here) and file (0600 when made here, so its
    ``-wal``/``-shm`` are 0600 too); files already there lose group and other permissions."""
    make_private_dirs(os.path.dirname(path))
    tightened = tighten_modes([path] + [path + side for side in SIDE_FILES])
    if tightened:
        log.warning("IPAM store files were readable by others, now 0600: %s", ", ".join(tightened))
    create_private(path)


def _kv(row: tuple) -> KV:
    key, value, mod_revision, create_revision = row
    return KV(bytes(key).decode(), bytes(value), mod_revision, create_revision)


def _current_revision(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT value FROM meta WHERE name = 'revision'").fetchone()[0]


def _all_hold(conn: sqlite3.Connection, compares: Sequence[Compare]) -> bool:
    """Every compare in one query: a key's mod_revision, 0 when absent."""
    if not compares:
        return True
    keys = [c.key.encode() for c in compares]
    marks = ",".join("?" * len(keys))
    found = dict(conn.execute(f"SELECT key, mod_revision FROM kv WHERE key IN ({marks})", keys))
    return all(found.get(key, 0) == c.mod_revision for key, c in zip(keys, compares, strict=True))


def _apply(conn: sqlite3.Connection, op: Op, revision: int) -> None:
    if isinstance(op, Put):
        conn.execute(UPSERT, (op.key.encode(), bytes(op.value), revision, revision))
    elif isinstance(op, Delete) and op.prefix:
        where, params = range_clause(op.key)
        conn.execute(f"DELETE FROM kv WHERE {where}", params)
    elif isinstance(op, Delete):
        conn.execute("DELETE FROM kv WHERE key = ?", (op.key.encode(),))
    else:
        raise TypeError(f"not a store op: {op!r}")

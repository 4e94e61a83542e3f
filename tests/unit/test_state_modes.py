"""pycni's state is root's alone: files 0600, directories 0700, older broader modes tightened."""

from __future__ import annotations

import logging
import os
import stat

from cni.files import create_private, make_private_dirs, tighten_modes
from ipam.outage.files import OutageFiles
from store.base import Put
from store.sqlite import SqliteStore
from tests.fixtures.modes import not_private, tree_modes


def mode_of(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_private_dirs_are_made_0700_down_the_whole_path_and_existing_ones_kept(tmp_path):
    os.chmod(tmp_path, 0o755)  # not pycni's: stays as it is
    make_private_dirs(str(tmp_path / "a" / "b" / "c"))
    assert tree_modes(str(tmp_path)) == {".": 0o755, "a": 0o700, "a/b": 0o700, "a/b/c": 0o700}


def test_create_private_makes_0600_and_leaves_an_existing_file_alone(tmp_path):
    path = str(tmp_path / "f")
    create_private(path)
    assert mode_of(path) == 0o600
    os.chmod(path, 0o640)
    create_private(path)
    assert mode_of(path) == 0o640


def test_tighten_takes_group_and_other_bits_off_and_names_what_changed(tmp_path):
    loose, tight = tmp_path / "loose", tmp_path / "tight"
    loose.write_bytes(b"")
    tight.write_bytes(b"")
    os.chmod(loose, 0o644)
    os.chmod(tight, 0o600)
    changed = tighten_modes([str(loose), str(tight), str(tmp_path / "absent")])
    assert changed == [f"{loose} (0644)"]
    assert mode_of(str(loose)) == 0o600 and mode_of(str(tight)) == 0o600


def test_a_fresh_sqlite_store_is_0600_with_its_wal_and_shm_in_0700_dirs(tmp_path):
    root = tmp_path / "state"
    store = SqliteStore(str(root / "pycni" / "store.db"))
    try:
        store.txn([], [Put("/k", b"v")])
        files = set(os.listdir(root / "pycni"))
        assert {"store.db", "store.db-wal", "store.db-shm"} <= files
        assert not_private(str(root)) == {}
    finally:
        store.close()


def test_an_older_0644_store_is_tightened_at_open_with_one_warning(tmp_path, caplog):
    path = str(tmp_path / "store.db")
    old_umask = os.umask(0o022)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))  # as SQLite made it before
        for side in ("-wal", "-shm"):
            os.close(os.open(path + side, os.O_CREAT | os.O_WRONLY, 0o644))
    finally:
        os.umask(old_umask)
    with caplog.at_level(logging.WARNING, logger="pycnid.store"):
        SqliteStore(path).close()
        SqliteStore(path).close()  # nothing left to tighten: no second warning
    assert not_private(str(tmp_path)) == {}
    warnings = [r.getMessage() for r in caplog.records if "readable by others" in r.getMessage()]
    assert len(warnings) == 1 and f"{path} (0644)" in warnings[0] and "-wal (0644)" in warnings[0]


def test_outage_journal_and_snapshot_are_0600_in_0700_dirs(tmp_path):
    files = OutageFiles(str(tmp_path / "state"), "node1")
    files.append({"seq": 1, "op": "del", "handle": {}})
    files.save_buffers({"p": [{"ip": "10.0.0.2"}]})
    files.rewrite([])
    assert set(os.listdir(files.dir)) == {"node1.journal", "node1.buffer.json"}
    assert not_private(str(tmp_path / "state")) == {}


def test_older_outage_files_are_tightened_once(tmp_path, caplog):
    files = OutageFiles(str(tmp_path), "node1")
    os.makedirs(files.dir, mode=0o755)
    for path in (files.journal_path, files.buffer_path):
        with open(path, "w") as fh:
            fh.write("")
        os.chmod(path, 0o644)
    os.chmod(files.dir, 0o755)
    with caplog.at_level(logging.WARNING, logger="pycnid.outage"):
        files.tighten()
        files.tighten()
    assert not_private(files.dir) == {}
    assert len([r for r in caplog.records if "readable by others" in r.getMessage()]) == 1

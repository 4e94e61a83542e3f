"""What only the embedded store does: persistence across reopen, errors, two openers."""

from __future__ import annotations

import os

import pytest

from cni.spec.errors import NotAvailable, TryAgainLater
from store.base import Compare, Put
from store.sqlite import SqliteStore, prefix_end


def test_prefix_end_bounds_a_byte_prefix():
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"") is None and prefix_end(b"\xff\xff") is None


def test_data_and_revision_survive_reopen(tmp_path):
    path = str(tmp_path / "sub" / "store.db")
    store = SqliteStore(path)
    result = store.txn([], [Put("/k", b"v")])
    store.close()
    again = SqliteStore(path)
    try:
        assert again.get("/k").value == b"v"
        assert again.revision() == result.revision
        assert again.txn([], [Put("/k2", b"v")]).revision == result.revision + 1
    finally:
        again.close()
    assert oct(os.stat(tmp_path / "sub").st_mode & 0o777) == "0o700"


def test_two_openers_of_one_file_share_revisions(tmp_path):
    a, b = SqliteStore(str(tmp_path / "s.db")), SqliteStore(str(tmp_path / "s.db"))
    try:
        first = a.txn([Compare("/k", 0)], [Put("/k", b"a")])
        assert first.succeeded
        assert not b.txn([Compare("/k", 0)], [Put("/k", b"b")]).succeeded
        assert b.txn([Compare("/k", first.revision)], [Put("/k", b"b")]).revision > first.revision
        assert a.get("/k").value == b"b"
    finally:
        a.close()
        b.close()


def test_closed_store_is_try_again_later_and_status_not_available(tmp_path):
    store = SqliteStore(str(tmp_path / "s.db"))
    store.close()
    with pytest.raises(TryAgainLater, match="closed"):
        store.get("/k")
    with pytest.raises(NotAvailable, match="sqlite:"):
        store.status()


def test_unopenable_path_names_the_store(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(TryAgainLater) as info:
        SqliteStore(str(blocker / "store.db"))
    assert str(blocker) in info.value.msg


def test_corrupt_file_is_try_again_later(tmp_path):
    path = tmp_path / "s.db"
    path.write_bytes(b"this is not a sqlite database at all" * 100)
    with pytest.raises(TryAgainLater, match="cannot open"):
        SqliteStore(str(path))

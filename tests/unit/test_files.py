"""cni/files.write_atomic: the old content or the whole new one, the asked mode, no temp file
left behind, whatever is written and whether the write fails."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni import files
from cni.files import write_atomic


@given(data=st.binary(max_size=4096), mode=st.sampled_from([0o600, 0o644, 0o755]))
def test_a_write_leaves_exactly_the_data_with_the_mode(tmp_path_factory, data, mode):
    directory = tmp_path_factory.mktemp("atomic")
    path = directory / "f"
    path.write_bytes(b"old")
    write_atomic(str(path), data, mode, durable=bool(len(data) % 2))
    assert path.read_bytes() == data
    assert stat.S_IMODE(os.stat(path).st_mode) == mode
    assert sorted(os.listdir(directory)) == ["f"]


def test_a_failed_write_keeps_the_old_content_and_removes_its_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "f"
    path.write_bytes(b"old")

    def refuse(_src: str, _dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", refuse)
    with pytest.raises(OSError):
        write_atomic(str(path), b"new", 0o644)
    assert path.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["f"]

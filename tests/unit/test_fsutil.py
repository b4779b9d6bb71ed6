"""The atomic-write helpers (shadefs.fsutil): a failed write leaves no temporary and keeps the old content,
for each writer that uses them (atomic_write, the disk tier's entries, the namespace snapshot)."""
from __future__ import annotations

import os

import pytest

from shadefs.backends.base import Entry
from shadefs.fsutil import atomic_write, removing_on_error, rename_into
from shadefs.namespace import Namespace


def test_removing_on_error_unlinks_on_any_exception_and_reraises_it(tmp_path):
    tmp = tmp_path / "t"
    for exc in (OSError(28, "No space left on device"), ValueError("short"), KeyboardInterrupt()):
        tmp.write_bytes(b"partial")
        with pytest.raises(type(exc)) as got:
            with removing_on_error(str(tmp)) as p:
                assert p == str(tmp)
                raise exc
        assert got.value is exc and not tmp.exists()


def test_removing_on_error_keeps_the_file_when_the_block_succeeds(tmp_path):
    tmp = tmp_path / "t"
    tmp.write_bytes(b"done")
    with removing_on_error(str(tmp)):
        pass
    assert tmp.read_bytes() == b"done"


def test_the_blocks_exception_propagates_when_the_unlink_fails(tmp_path):
    with pytest.raises(ValueError, match="first"):
        with removing_on_error(str(tmp_path / "never-created")):
            raise ValueError("first")


def test_rename_into_creates_the_missing_parent(tmp_path):
    tmp = tmp_path / "t"
    tmp.write_bytes(b"x")
    rename_into(str(tmp), str(tmp_path / "a" / "b"))
    assert (tmp_path / "a" / "b").read_bytes() == b"x" and not tmp.exists()
    assert oct(os.stat(tmp_path / "a").st_mode & 0o777) == oct(0o700 & ~_umask())


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def test_a_failed_atomic_write_leaves_no_temporary_and_the_old_content(tmp_path):
    tmp_dir = tmp_path / "tmp"
    tmp_dir.mkdir()
    target = tmp_path / "target"
    target.mkdir()                      # a rename of a file over a directory fails (IsADirectoryError)
    with pytest.raises(IsADirectoryError):
        atomic_write(str(target), b"new", tmp_dir=str(tmp_dir), fsync=True)
    assert os.listdir(tmp_dir) == [] and target.is_dir()
    ok = tmp_path / "ok"
    ok.write_bytes(b"old")
    atomic_write(str(ok), b"new", tmp_dir=str(tmp_dir), mtime_ns=1_000_000_000)
    assert ok.read_bytes() == b"new" and os.stat(ok).st_mtime_ns == 1_000_000_000 and os.listdir(tmp_dir) == []


def test_a_failed_namespace_snapshot_leaves_no_temporary(tmp_path):
    (tmp_path / "tmp").mkdir()          # save() writes its temporary in tmp/ beside the snapshot
    target = tmp_path / "ns.bin"
    target.mkdir()
    ns = Namespace([Entry("a/b.bin", 3, 1.0)])
    with pytest.raises(IsADirectoryError):
        ns.save(str(target), {})
    assert os.listdir(tmp_path / "tmp") == [] and target.is_dir()
    (tmp_path / "ok.bin").write_bytes(b"old")
    assert ns.save(str(tmp_path / "ok.bin"), {}) == os.path.getsize(tmp_path / "ok.bin")
    assert os.listdir(tmp_path / "tmp") == []
    got, why = Namespace.load(str(tmp_path / "ok.bin"), {})
    assert why == "" and got.path(0) == "a/b.bin"

"""The namespace snapshot beside the disk tier: reused when the source is unchanged, rebuilt when a
directory changed, when it is damaged, or with --rescan."""
import os

import pytest

from conftest import make_tree
from mountutil import read

pytestmark = pytest.mark.usefixtures("fuse")  # skipped without /dev/fuse + fusermount3; failed under CI=true


def remount(mount, src, cache, *extra):
    return mount(src, "--disk-cache", cache, "--disk-cache-size", "1MiB", *extra)


def snapshot_file(cache):
    found = [os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs if f == "namespace.bin"]
    assert len(found) == 1, found
    return found[0]


def test_an_unchanged_source_is_served_from_the_snapshot(small_tree, tmp_path, mount):
    src, spec = small_tree
    cache = str(tmp_path / "cache")
    (src / "empty").mkdir()
    m = remount(mount, src, cache)
    assert m.stats()["namespace"]["from_snapshot"] is False
    # the daemon's scan runs in a child process: the listing's heap never lives in the daemon
    assert "namespace scanned and built in a child process" in m.log()
    m.umount()
    m = remount(mount, src, cache)
    ns = m.stats()["namespace"]
    assert ns["from_snapshot"] is True and (ns["files"], ns["directories"]) == (10, 4)
    assert "is current (4 directories unchanged)" in m.log()
    assert sorted(os.listdir(m.path)) == ["cat", "dog", "empty"]
    for rel, data in spec.items():
        assert read(os.path.join(m.path, rel)) == data
    m.umount()
    m = remount(mount, src, cache, "--rescan")
    assert m.stats()["namespace"]["from_snapshot"] is False
    assert "not used (--rescan)" in m.log()


def test_a_changed_directory_or_a_damaged_snapshot_means_a_scan(small_tree, tmp_path, mount):
    src, spec = small_tree
    cache = str(tmp_path / "cache")
    remount(mount, src, cache).umount()
    make_tree(src, {"cat/new.bin": b"n" * 7})
    m = remount(mount, src, cache)
    assert m.stats()["namespace"]["from_snapshot"] is False
    assert "directory 'cat' changed" in m.log()
    assert read(os.path.join(m.path, "cat/new.bin")) == b"n" * 7
    m.umount()
    os.chmod(src / "dog", 0o700)  # a chmod changes the directory's ctime, not its mtime
    m = remount(mount, src, cache)
    assert m.stats()["namespace"]["from_snapshot"] is False and "directory 'dog' changed" in m.log()
    m.umount()
    path = snapshot_file(cache)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    m = remount(mount, src, cache)
    assert m.stats()["namespace"]["from_snapshot"] is False and "checksum mismatch" in m.log()
    assert read(os.path.join(m.path, "cat/new.bin")) == b"n" * 7
    m.umount()
    m = remount(mount, src, cache, "--follow-symlinks")  # another setting: another snapshot key
    assert m.stats()["namespace"]["from_snapshot"] is False and "--follow-symlinks setting" in m.log()

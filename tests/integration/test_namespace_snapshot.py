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


def as_format_2(path):
    """Rewrite the snapshot at ``path`` as the previous format wrote it: file mtimes as float64 seconds
    (``mtimes``, the same 8 bytes a file), no directory sizes, version 2, a valid checksum."""
    import json
    import struct

    import numpy as np
    from xxhash import xxh3_64_intdigest

    buf = bytearray(open(path, "rb").read())
    magic = buf[:buf.index(b"\n") + 1]
    (hlen,) = struct.unpack("<Q", buf[len(magic):len(magic) + 8])
    header = json.loads(bytes(buf[len(magic) + 8:len(magic) + 8 + hlen]))
    base = len(magic) + 8 + hlen
    base += (-base) % 64
    layout = []
    for name, off, dtype, shape in header["arrays"]:
        if name == "mtimes_ns":
            a = np.frombuffer(bytes(buf[base + off:base + off + 8 * shape[0]]), "<i8")
            buf[base + off:base + off + 8 * shape[0]] = (a / 1e9).astype("<f8").tobytes()
            name, dtype = "mtimes", "<f8"
        if name != "_dir_size":
            layout.append([name, off, dtype, shape])
    header["arrays"] = layout
    new = json.dumps(header, ensure_ascii=True).encode()
    new += b" " * (hlen - len(new))  # the same length: the arrays keep their offsets
    assert len(magic) == 20  # as long as the old magic: the alignment holds
    body = b"SHADEFS-NAMESPACE-2\n" + struct.pack("<Q", hlen) + new + bytes(buf[len(magic) + 8 + hlen:-8])
    with open(path, "wb") as f:
        f.write(body + struct.pack("<Q", xxh3_64_intdigest(body)))


def test_a_snapshot_of_the_previous_format_is_rescanned_not_misread(small_tree, tmp_path, mount):
    """Format 3 keeps file mtimes in integer nanoseconds: a format-2 snapshot (float seconds) is
    rescanned, so the mount serves the exact mtime, never one read from the old layout."""
    src, _ = small_tree
    t = 1_000_000_000_123_456_789  # float seconds would give ...123456716
    os.utime(src / "cat" / "01.bin", ns=(t, t))
    cache = str(tmp_path / "cache")
    m = remount(mount, src, cache)
    assert os.stat(os.path.join(m.path, "cat", "01.bin")).st_mtime_ns == t
    m.umount()
    m = remount(mount, src, cache)
    assert m.stats()["namespace"]["from_snapshot"] is True  # the exact ns survive a snapshot
    assert os.stat(os.path.join(m.path, "cat", "01.bin")).st_mtime_ns == t
    assert os.stat(os.path.join(m.path, "cat")).st_size == os.stat(src / "cat").st_size
    m.umount()
    as_format_2(snapshot_file(cache))
    m = remount(mount, src, cache)
    assert m.stats()["namespace"]["from_snapshot"] is False
    assert "not used (another format (version 2; this daemon reads version 3))" in m.log()
    assert os.stat(os.path.join(m.path, "cat", "01.bin")).st_mtime_ns == t
    m.umount()
    m = remount(mount, src, cache)  # the rescan wrote a current snapshot
    assert m.stats()["namespace"]["from_snapshot"] is True

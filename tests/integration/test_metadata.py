"""The mount's metadata is the source's: mtimes to the nanosecond, directory sizes, modes less the write
bits; so an archive of the mount is an archive of the source."""
import io
import os
import stat
import subprocess
import tarfile

import pytest

from conftest import make_tree, require

pytestmark = [pytest.mark.usefixtures("fuse"),  # skipped without /dev/fuse + fusermount3; failed under CI=true
              pytest.mark.both_frontends]

# 1000000000.123456789 s: a float of seconds holds it only as ...123456716 (its nearest double)
T_NS = 1_000_000_000_123_456_789


def tree(root):
    """A few files and directories, one empty; every file and directory stamped with a distinct mtime
    that has nanoseconds (directories last: creating their entries changes them)."""
    make_tree(root, {"a/x.bin": os.urandom(5000), "a/b/y.bin": os.urandom(70_000), "top.txt": b"hello\n",
                     "a/b/z": b""})
    (root / "empty").mkdir()
    paths = sorted((os.path.join(d, n) for d, ds, fs in os.walk(root) for n in ds + fs), key=len, reverse=True)
    for i, p in enumerate(paths + [str(root)]):
        os.utime(p, ns=(T_NS + i, T_NS + 1000 * i + 7))
    subprocess.run(["touch", "-d", "@1000000000.123456789", str(root / "top.txt")], check=True)
    return root


def stat_c(path) -> str:
    return subprocess.run(["stat", "-c", "%y", path], capture_output=True, text=True, check=True).stdout.strip()


def test_stat_through_the_mount_is_the_sources_to_the_nanosecond(tmp_path, mount):
    src = tree(tmp_path / "src")
    m = mount(src, "--ram-cache", "1MiB")
    for d, ds, fs in os.walk(src):
        for name in ["."] + ds + fs:
            rel = os.path.relpath(os.path.join(d, name), src)
            s, t = os.stat(src / rel), os.stat(os.path.join(m.path, rel))
            assert t.st_mtime_ns == s.st_mtime_ns, rel
            assert t.st_size == s.st_size, rel  # directories too (the source's, not 0)
            assert t.st_mode == s.st_mode & ~0o222, rel
            assert (t.st_uid, t.st_gid, t.st_nlink) == (s.st_uid, s.st_gid, s.st_nlink), rel
            assert t.st_atime_ns == t.st_ctime_ns == t.st_mtime_ns, rel  # a snapshot serves its mtime for both
    # what a user sees ("touch -d @1000000000.123456789"): 01:46:40.123456789, not .123456716 (a float)
    assert stat_c(os.path.join(m.path, "top.txt")) == stat_c(src / "top.txt")
    assert os.stat(os.path.join(m.path, "top.txt")).st_mtime_ns == T_NS
    assert ":40.123456789 " in stat_c(os.path.join(m.path, "top.txt"))


def tar(root, *options) -> bytes:
    return subprocess.run(["tar", "--format=posix", "--sort=name", *options, "-cf", "-", "-C", str(root), "."],
                          capture_output=True, check=True, timeout=60).stdout


def members(data: bytes):
    out = []
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        for mi in t.getmembers():
            body = t.extractfile(mi).read() if mi.isfile() else None
            out.append((mi.name, mi.type, mi.size, mi.pax_headers.get("mtime"), mi.mode & ~0o222, mi.uid, mi.gid,
                        mi.uname, mi.gname, body))
    return out


def test_tar_of_the_mount_is_tar_of_the_source(tmp_path, mount):
    """GNU tar's POSIX format keeps mtimes to the nanosecond (pax headers): the mount's archive has the
    source's members, and without write bits in the source and without access/change times (which a
    read moves, and the mount serves as the mtime) the very same bytes."""
    require("tar")
    src = tree(tmp_path / "src")
    m = mount(src, "--ram-cache", "1MiB")
    mine, theirs = members(tar(m.path)), members(tar(src))
    assert [x[0] for x in mine] == [x[0] for x in theirs] and len(mine) == 8
    assert mine == theirs
    assert ("./top.txt", tarfile.REGTYPE, 6, "1000000000.123456789") in [x[:4] for x in mine]
    m.umount()
    for d, ds, fs in os.walk(src):
        for name in ds + fs:
            p = os.path.join(d, name)
            os.chmod(p, stat.S_IMODE(os.stat(p).st_mode) & ~0o222)
    os.chmod(src, 0o555)
    try:
        m = mount(src, "--ram-cache", "1MiB")
        opts = ("--pax-option=delete=atime,delete=ctime",)
        assert tar(m.path, *opts) == tar(src, *opts)
    finally:
        for d, ds, _ in os.walk(src):
            for name in ["."] + ds:
                os.chmod(os.path.join(d, name), 0o755)

"""Opening source files beneath the root with no symlink followed (shadefs.backends.beneath), through
``openat2`` and through its per-component fallback, and the posix backend's check of each opened file
against the snapshot (inode tag, size, mtime)."""
import errno
import os

import pytest

from shadefs.backends import beneath
from shadefs.backends.base import BackendError, StaleSource
from shadefs.backends.posix import PosixBackend
from shadefs.namespace import Namespace


@pytest.fixture(params=["openat2", "walk"])
def resolver(request, monkeypatch):
    """Each test runs through openat2 (where the kernel has it) and through the O_NOFOLLOW walk."""
    if request.param == "openat2":
        if not beneath.have_openat2():
            pytest.skip("this kernel (or its seccomp filter) has no openat2")
    else:
        monkeypatch.setattr(beneath, "_have", False)
    return request.param


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "src"
    (src / "d" / "e").mkdir(parents=True)
    (src / "d" / "e" / "f.bin").write_bytes(b"f" * 10)
    (src / "t.bin").write_bytes(b"t" * 10)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"o" * 10)
    return src, outside


def test_a_symlink_anywhere_on_the_path_is_never_followed(tree, resolver):
    src, outside = tree
    os.symlink("e", src / "d" / "le")
    os.symlink("f.bin", src / "d" / "e" / "lf")
    os.symlink(str(outside), src / "d" / "lo")
    root = os.open(src, os.O_PATH | os.O_DIRECTORY)
    try:
        fd = beneath.open_beneath(root, "d/e/f.bin", os.O_RDONLY)
        assert os.read(fd, 100) == b"f" * 10
        os.close(fd)
        for rel in ("d/le/f.bin", "d/e/lf", "d/lo"):
            for flags in (os.O_RDONLY, os.O_PATH):
                with pytest.raises(OSError) as e:
                    beneath.open_beneath(root, rel, flags)
                assert e.value.errno == errno.ELOOP, (rel, flags)
        for rel in ("../outside.bin", "/etc/passwd", "d/../../outside.bin"):
            with pytest.raises(OSError) as e:
                beneath.open_beneath(root, rel, os.O_RDONLY)
            assert e.value.errno == errno.EXDEV, rel
        with pytest.raises(FileNotFoundError):
            beneath.open_beneath(root, "d/nope.bin", os.O_RDONLY)
    finally:
        os.close(root)


def _attached(src, follow=False):
    b = PosixBackend(str(src))
    ns = Namespace.scan(b, follow_symlinks=follow)
    b.attach(ns, follow)
    return b, ns


def test_symlinks_the_scan_served_are_read_as_it_resolved_them(tree, resolver):
    src, outside = tree
    os.symlink("e/f.bin", src / "d" / "in.bin")
    os.symlink("e", src / "d" / "dirlink")
    b, ns = _attached(src)
    assert b.read("d/in.bin", 10) == b"f" * 10
    assert b.read("d/dirlink/f.bin", 10) == b"f" * 10
    assert b.read_range("d/dirlink/f.bin", 2, 3) == b"fff"
    assert b.stat("d/in.bin")[0] == 10


def test_a_file_swapped_after_the_scan_is_refused(tree, resolver):
    src, outside = tree
    b, ns = _attached(src)
    os.unlink(src / "t.bin")
    os.symlink(str(outside), src / "t.bin")           # a symlink out of the tree
    os.rename(src / "d" / "e", src / "d" / "e.old")
    os.symlink("..", src / "d" / "e")                  # a directory swapped for a symlink inside
    (src / "f.bin").write_bytes(b"x" * 10)
    for call in (lambda: b.read("t.bin", 10), lambda: b.read_range("t.bin", 0, 10),
                 lambda: b.read("d/e/f.bin", 10)):
        with pytest.raises(StaleSource) as e:
            call()
        assert e.value.errno == errno.ESTALE


def test_another_inode_size_or_mtime_than_the_snapshots_is_refused(tree, resolver):
    src, outside = tree
    b, ns = _attached(src)
    p = src / "d" / "e" / "f.bin"
    st = os.stat(p)
    new = src / "new.bin"
    new.write_bytes(b"n" * 10)
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, p)                                 # same size and mtime, another inode
    with pytest.raises(StaleSource, match="another file"):
        b.read("d/e/f.bin", 10)
    with open(src / "t.bin", "r+b") as f:              # same inode and size, another mtime
        f.write(b"T")
    with pytest.raises(BackendError, match="mtime .* changed under the mount") as e:
        b.read("t.bin", 10)
    assert not isinstance(e.value, StaleSource)   # the same file, changed: EIO
    assert b.identify("t.bin")[:1] == (10,)

"""The namespace's node API (ids, child/parent/listdir/attr), as the kernel-protocol front end uses it."""
from __future__ import annotations

import os
import stat

from shadefs.backends.base import Entry
from shadefs.namespace import Namespace

FILES = [Entry("b/x.bin", 3, 10.5), Entry("a.txt", 1, 1.0), Entry("b/c/y", 7, 2.0), Entry("b/c/z", 0, 3.0)]


def make():
    return Namespace(FILES)


def test_ids_files_sorted_then_directories():
    ns = make()
    assert ns.num_files == 4
    assert [ns.path(i) for i in range(4)] == ["a.txt", "b/c/y", "b/c/z", "b/x.bin"]
    assert ns.root == 4 and ns.num_nodes == 7
    assert all(ns.is_dir(n) for n in range(4, 7)) and not any(ns.is_dir(n) for n in range(4))


def test_child_and_parent():
    ns = make()
    b = ns.child(ns.root, "b")
    c = ns.child(b, "c")
    assert b == ns.lookup("b") and c == ns.lookup("/b/c")
    assert ns.child(c, "y") == 1 and ns.child(b, "x.bin") == 3 and ns.child(ns.root, "a.txt") == 0
    for bad in ("", ".", "..", "c/y", "nope", "y\x00"):
        assert ns.child(b, bad) is None
    assert ns.child(0, "x") is None  # a file has no children
    assert ns.parent(1) == c and ns.parent(c) == b and ns.parent(b) == ns.root and ns.parent(0) == ns.root
    assert ns.parent(ns.root) == ns.root


def test_listdir_matches_entries():
    ns = make()
    b = ns.lookup("b")
    assert ns.listdir(ns.root) == [("a.txt", 0), ("b", b)]
    assert ns.listdir(b) == [("c", ns.lookup("b/c")), ("x.bin", 3)]
    assert [n for n, _ in ns.listdir(b)] == [n for n, _, _ in ns.entries(b)]


def test_attr():
    ns = make()
    mode, size, mtime_ns, uid, gid, nlink = ns.attr(3)
    assert stat.S_ISREG(mode) and mode & 0o222 == 0
    assert (size, mtime_ns, nlink) == (3, 10_500_000_000, 1)
    assert (uid, gid) == (os.getuid(), os.getgid())
    mode, size, _, _, _, nlink = ns.attr(ns.lookup("b"))
    assert stat.S_ISDIR(mode) and size == 0 and nlink == 3  # 2 + one subdirectory
    assert ns.attr(ns.root)[5] == 3
    st = ns.stat(3)
    assert (st["st_mode"], st["st_size"], st["st_mtime"]) == ns.attr(3)[:3]

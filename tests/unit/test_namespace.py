"""The namespace's node API (ids, child/parent/listdir/attr), as the kernel-protocol front end uses it."""
from __future__ import annotations

import os
import stat

from shadefs.backends.base import Entry
from shadefs.namespace import Namespace

FILES = [Entry("b/x.bin", 3, 10_500_000_001), Entry("a.txt", 1, 1), Entry("b/c/y", 7, 2), Entry("b/c/z", 0, 3)]


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
    assert (size, mtime_ns, nlink) == (3, 10_500_000_001, 1)
    assert (uid, gid) == (os.getuid(), os.getgid())
    mode, size, _, _, _, nlink = ns.attr(ns.lookup("b"))
    assert stat.S_ISDIR(mode) and size == 0 and nlink == 3  # 2 + one subdirectory
    assert ns.attr(ns.root)[5] == 3
    st = ns.stat(3)
    assert (st["st_mode"], st["st_size"], st["st_mtime"]) == ns.attr(3)[:3]


# -- the structured scan of a real directory tree, and snapshots -------------------------------------------
import pytest  # noqa: E402

from shadefs.backends.posix import PosixBackend  # noqa: E402

TRICKY = ["a/b.txt", "a/b/x", "a/b/c/z", "a/b0", "a/b-", "a/ü.png", "a/z z", "top.bin", "a/\udcff.raw", "e/1"]


@pytest.fixture
def tricky(tmp_path):
    root = tmp_path / "src"
    for i, rel in enumerate(TRICKY):
        p = os.path.join(os.fsencode(str(root)), os.fsencode(rel))
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(b"x" * i)
    os.makedirs(root / "empty" / "deeper")
    os.chmod(root / "top.bin", 0o640)
    t = 1_000_000_000_123_456_789  # a float of seconds would read it as ...123456716
    os.utime(root / "top.bin", ns=(t, t))
    return root


def check_tree(ns, root):
    paths = sorted(TRICKY)
    assert ns.num_files == len(paths) and list(ns.paths) == paths
    assert [ns.path(i) for i in range(ns.num_files)] == paths
    assert ns.dir_paths == ["", "a", "a/b", "a/b/c", "e", "empty", "empty/deeper"]
    for i, p in enumerate(paths):
        assert ns.lookup(p) == i and ns.lookup("/" + p) == i and ns.file_id(p) == i
        assert ns.size(i) == TRICKY.index(p)
        assert ns.parent(i) == ns.lookup(os.path.dirname(p))
        assert ns.child(ns.parent(i), os.path.basename(p)) == i
    assert ns.file_ids(["a/b/x", "nope", "a"]).tolist() == [paths.index("a/b/x"), -1, -1]
    a = ns.lookup("a")
    assert [n for n, _ in ns.listdir(a)] == sorted(["b.txt", "b", "b0", "b-", "ü.png", "z z", "\udcff.raw"])
    assert ns.children(ns.lookup("empty")) == ("deeper",) and ns.listdir(ns.lookup("empty/deeper")) == []
    assert ns.attr(a)[5] == 3 and ns.attr(ns.root)[5] == 5
    mode, _, mtime_ns, uid, gid, _ = ns.attr(ns.lookup("top.bin"))
    st = os.stat(root / "top.bin")
    assert (mode, uid, gid) == (stat.S_IFREG | 0o440, st.st_uid, st.st_gid)
    assert mtime_ns == st.st_mtime_ns  # to the nanosecond
    assert ns.attr(ns.lookup("a/b"))[2] == os.stat(root / "a" / "b").st_mtime_ns
    assert ns.attr(a)[1] == os.stat(root / "a").st_size and ns.attr(ns.root)[1] == os.stat(root).st_size
    for bad in ("a/b/", "a//b", "a/./b", "nope/x", "a/b.txt/x"):
        assert ns.lookup(bad) is None


def test_scan_of_a_real_tree(tricky):
    for workers in (1, 4):
        ns = Namespace.scan(PosixBackend(str(tricky), scan_workers=workers))
        check_tree(ns, tricky)


def test_snapshot_round_trip_and_rejections(tricky, tmp_path):
    ns = Namespace.scan(PosixBackend(str(tricky)))
    path = str(tmp_path / "ns.bin")
    key = {"root": str(tricky), "v": 1}
    ns.save(path, key)
    loaded, why = Namespace.load(path, key)
    assert why == "" and loaded.from_snapshot and loaded.fingerprint == ns.fingerprint
    check_tree(loaded, tricky)
    assert Namespace.load(path, {"root": "elsewhere", "v": 1})[0] is None
    assert Namespace.load(str(tmp_path / "missing"), key) == (None, "no snapshot")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 1
    open(path, "wb").write(bytes(data))
    loaded, why = Namespace.load(path, key)
    assert loaded is None and "checksum" in why


def test_a_key_that_is_also_a_prefix_keeps_the_directory():
    ns = Namespace([Entry("a", 1, 0.0), Entry("a/b", 2, 0.0), Entry("c", 3, 0.0)])
    assert list(ns.paths) == ["a/b", "c"] and ns.skipped == ["a"] and ns.report.count("conflicts") == 1
    assert ns.is_dir(ns.lookup("a"))


def test_an_empty_source_round_trips(tmp_path):
    (tmp_path / "src" / "only_dirs").mkdir(parents=True)
    ns = Namespace.scan(PosixBackend(str(tmp_path / "src")))
    assert (ns.num_files, ns.num_dirs, ns.total_bytes) == (0, 2, 0) and list(ns.paths) == []
    ns.save(str(tmp_path / "ns.bin"), {})
    loaded, why = Namespace.load(str(tmp_path / "ns.bin"), {})
    assert why == "" and loaded.listdir(loaded.root) == [("only_dirs", 1)] and loaded.lookup("only_dirs") == 1


def test_posix_scan_threads_default_to_one_on_a_local_filesystem(tmp_path):
    """A warm local scan is CPU-bound: one listing thread (16 contend for the GIL; docs/performance.md);
    a network or FUSE source gets 16; an explicit scan_workers wins."""
    from shadefs.backends import posix

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_bytes(b"x")
    kind = posix._fs_type(str(tmp_path))
    assert kind and kind == posix._fs_type(str(tmp_path / "d"))
    want = 1 if kind in posix.LOCAL_FS else posix.REMOTE_SCAN_WORKERS
    assert posix.PosixBackend(str(tmp_path)).scan_workers == want
    assert posix._fs_type("/proc/self") == "proc" and "proc" not in posix.LOCAL_FS
    assert posix.PosixBackend(str(tmp_path), scan_workers="4").scan_workers == 4
    assert Namespace.scan(posix.PosixBackend(str(tmp_path))).num_files == 1


def _helper_tree(tricky, tmp_path):
    """``tricky`` with 12 subtrees to hand out, and symlinks inside/outside/dangling, a loop, a fifo."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "o.bin").write_bytes(b"o")
    for i in range(12):  # enough subtrees to hand out
        d = tricky / f"d{i:02d}"
        (d / "sub").mkdir(parents=True)
        (d / "f.bin").write_bytes(b"f" * i)
        (d / "sub" / "g.bin").write_bytes(b"g")
    os.symlink("../d00/f.bin", tricky / "d01" / "in.bin")          # inside: served as its target
    os.symlink(str(outside / "o.bin"), tricky / "d02" / "out.bin")  # outside: skipped
    os.symlink("nope", tricky / "d03" / "dangling")                 # dangling: skipped
    os.symlink("..", tricky / "d04" / "sub" / "loop")               # a loop: skipped
    os.mkfifo(tricky / "d05" / "fifo")                               # special: skipped


def test_posix_scan_in_helper_processes_equals_the_one_thread_scan(tricky, tmp_path):
    """A listing that runs past scan_after_s hands its subtrees to helper processes (here fresh
    interpreters: pytest runs a timeout thread, so no fork): the same tree, the same bytes of every
    array, the same report (symlinks inside/outside/dangling, a loop, a fifo)."""
    from shadefs.backends import posix

    _helper_tree(tricky, tmp_path)

    def scan(processes, after):
        b = posix.PosixBackend(str(tricky), scan_processes=processes)
        b.scan_after_s = after
        return Namespace.scan(b)

    one = scan(1, 0.0)
    many = scan(3, 0.0)
    assert many.num_files == one.num_files == len(TRICKY) + 12 * 2 + 1
    assert many.fingerprint == one.fingerprint and list(many.paths) == list(one.paths)
    for name in ("sizes", "mtimes_ns", "etags", "_off", "_parent", "_perm", "_keys", "_key_ids", "_kids",
                 "_dir_start", "_dir_nlink", "_dir_mtime_ns", "_dir_ctime_ns", "_dir_size"):
        assert getattr(many, name).tobytes() == getattr(one, name).tobytes(), name
    assert bytes(many._blob) == bytes(one._blob)
    assert many.report.counts == one.report.counts == {"symlinks_outside": 1, "symlinks_dangling": 1,
                                                        "loops": 1, "special": 1}
    assert {k: sorted(v) for k, v in many.report.examples.items()} == \
        {k: sorted(v) for k, v in one.report.examples.items()}
    assert many.lookup("d01/in.bin") is not None and many.lookup("d02/out.bin") is None
    with pytest.raises(posix.BackendError):
        posix.PosixBackend(str(tricky), scan_processes="0")


ISOLATED = r"""
import json, os, signal, sys, time
from shadefs.backends import posix
from shadefs.backends.base import BackendError
from shadefs.namespace import Namespace

root, case, processes = sys.argv[1], sys.argv[2], int(sys.argv[3])
record = os.path.join(os.path.dirname(root), "pids")
listed = posix._scan_subtree

def recording_subtree(*a):  # inherited by forked helpers only (a fresh interpreter imports its own)
    with open(record + ".subtree", "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(0.05)  # every subtree takes a while: no process claims them all before the others start
    return listed(*a)

posix._scan_subtree = recording_subtree

class Recording(posix.PosixBackend):
    def scan(self, follow_symlinks=False):
        with open(record, "a") as f:
            f.write(f"{os.getpid()}\n")
        if case == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        if case == "raise":
            raise BackendError("listing failed: boom")
        return super().scan(follow_symlinks)

out = {"pid": os.getpid()}
b = Recording(root, scan_processes=processes)
b.scan_after_s = 0.0
try:
    ns = Namespace.scan(b, isolate=case != "forks", snapshot_key={"k": [1, 2]})
except OSError as e:
    out["error"] = [type(e).__name__, str(e)]
else:
    one = Namespace.scan(posix.PosixBackend(root, scan_processes=1))
    out["from_snapshot"] = ns.from_snapshot
    out["same"] = [n for n in ("sizes", "mtimes_ns", "etags", "_off", "_parent", "_perm", "_perm_table", "_keys",
                               "_key_ids", "_kids", "_dir_start", "_dir_nlink", "_dir_mtime_ns", "_dir_ctime_ns",
                               "_dir_size")
                   if getattr(ns, n).tobytes() == getattr(one, n).tobytes()]
    out["blob"] = bytes(ns._blob) == bytes(one._blob)
    out["dirs"] = ns.dir_paths == one.dir_paths and ns.fingerprint == one.fingerprint
    out["report"] = [ns.report.counts, one.report.counts, ns.report.examples == one.report.examples]
    out["paths"] = list(ns.paths)
    saved = []
    for image in (True, False):  # an isolated scan writes its buffer as it is: the file save() writes
        if not image:
            ns.__dict__.pop("_image", None)
        path = os.path.join(os.path.dirname(root), f"ns{len(saved)}.bin")
        ns.save(path, {"k": [1, 2]})
        saved.append(open(path, "rb").read())
    out["saved_same"] = saved[0] == saved[1] and Namespace.load(path, {"k": [1, 2]})[1] == ""
out["scanned_in"] = [int(x) for x in open(record).read().split()]
out["subtrees_in"] = sorted(set(int(x) for x in open(record + ".subtree").read().split())) \
    if os.path.exists(record + ".subtree") else []
print(json.dumps(out))
"""


def _isolated(root, case, processes=1):
    """Run ISOLATED in a fresh interpreter (no thread but its main one, so a scan may fork)."""
    import json
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", ISOLATED, str(root), case, str(processes)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_an_isolated_scan_runs_in_a_child_and_equals_the_in_process_scan(tricky, tmp_path):
    """Namespace.scan(isolate=True) (the daemon's) lists and builds in a forked child and hands the arrays
    back through a memfd: the same bytes of every array, paths, report (a dangling link, a loop, a fifo)."""
    os.symlink("nope", tricky / "a" / "dangling")
    os.symlink("..", tricky / "a" / "b" / "loop")
    os.mkfifo(tricky / "e" / "fifo")
    out = _isolated(tricky, "ok")
    assert out["from_snapshot"] is False and out["blob"] and out["dirs"] and out["saved_same"]
    assert len(out["same"]) == 15, out["same"]
    assert out["report"][0] == out["report"][1] == {"symlinks_dangling": 1, "loops": 1, "special": 1}
    assert out["report"][2] is True
    assert out["paths"] == sorted(TRICKY)
    assert len(out["scanned_in"]) == 1 and out["scanned_in"][0] != out["pid"]  # listed in a child


def test_an_isolated_scan_reports_the_childs_error_and_its_death(tmp_path):
    (tmp_path / "src").mkdir()
    assert _isolated(tmp_path / "src", "raise")["error"] == ["BackendError", "listing failed: boom"]
    died = _isolated(tmp_path / "src", "die")["error"]
    assert died[0] == "BackendError" and "the scan process died (signal SIGKILL)" in died[1]
    gone = _isolated(tmp_path / "missing", "ok")["error"]
    assert gone == ["FileNotFoundError", f"source {str(tmp_path / 'missing')!r} is not a directory"]


def test_an_isolated_scan_stays_in_process_while_another_thread_runs(tricky):
    """A fork copies only the calling thread: with another thread alive the scan is not forked."""
    import threading

    seen = []

    class Recording(PosixBackend):
        def scan(self, follow_symlinks=False):
            seen.append(os.getpid())
            return super().scan(follow_symlinks)

    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        ns = Namespace.scan(Recording(str(tricky)), isolate=True)
    finally:
        stop.set()
        t.join()
    assert seen == [os.getpid()]
    check_tree(ns, tricky)


@pytest.mark.slow
def test_posix_scan_in_forked_helpers_equals_the_one_thread_scan(tricky, tmp_path):
    """Where nothing but the main thread runs, the helpers are forked and claim subtrees from a pipe:
    the same bytes of every array as the 1-thread scan, and subtrees listed in more than one process;
    the same inside the daemon's isolated scan child."""
    _helper_tree(tricky, tmp_path)
    for case in ("forks", "ok"):
        for f in ("pids", "pids.subtree"):
            if os.path.exists(tricky.parent / f):
                os.unlink(tricky.parent / f)
        out = _isolated(tricky, case, processes=3)
        assert out["blob"] and out["dirs"] and out["saved_same"] and len(out["same"]) == 15, out
        assert out["report"][0] == out["report"][1] == {"symlinks_outside": 1, "symlinks_dangling": 1,
                                                        "loops": 1, "special": 1}
        assert len(out["paths"]) == len(TRICKY) + 12 * 2 + 1
        assert len(out["subtrees_in"]) >= 2, out["subtrees_in"]   # this process and a forked helper
        assert (out["pid"] in out["subtrees_in"]) == (case == "forks")

"""What a mount trusts of its source after the scan (docs/operations.md, "What is checked when"): a
symlink swapped in is never followed, a file rewritten in place is read again after a remount, and a
daemon out of file descriptors deletes no valid disk entry."""
import errno
import os
import shutil
import sys
import tempfile

import pytest

from conftest import Mount, make_tree
from mountutil import read
from shadefs.testing import mounts as _mounts
from shadefs.testing.mounts import wait_for
from shadefs.testing.users import NOBODY, as_nobody
from test_security import public_mount  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.usefixtures("fuse"),  # skipped without /dev/fuse + fusermount3; failed under CI=true
              pytest.mark.both_frontends]


def _disk_tier(cache):
    return ("--disk-cache", str(cache), "--disk-cache-size", "4MiB")


@pytest.fixture
def shared_base():
    """A directory every user can reach (pytest's tmp_path is 0700)."""
    base = tempfile.mkdtemp(prefix="shadefs-trust-", dir="/tmp")
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_a_symlink_swapped_in_after_the_scan_is_never_followed(shared_base, tmp_path, public_mount):  # noqa: F811
    if os.geteuid() != 0:
        pytest.skip("needs root: a root daemon with --allow-other and a second user")
    log = _swap_after_the_scan(shared_base, tmp_path, public_mount)
    assert "O_NOFOLLOW component at a time" not in log


def test_without_openat2_a_symlink_swapped_in_after_the_scan_is_never_followed(shared_base, tmp_path,
                                                                              public_mount,  # noqa: F811
                                                                              monkeypatch):
    """The same through the fallback for kernels without openat2: one openat(O_NOFOLLOW) per component."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a root daemon with --allow-other and a second user")
    monkeypatch.setenv("SHADEFS_NO_OPENAT2", "1")   # the daemon's posix backend walks the components
    log = _swap_after_the_scan(shared_base, tmp_path, public_mount)
    assert "SHADEFS_NO_OPENAT2=1: source files are opened one O_NOFOLLOW component at a time" in log


def _swap_after_the_scan(shared_base, tmp_path, public_mount):  # noqa: F811
    """Mount a tree with a corner another user owns, let that user swap its files and a directory for
    symlinks to bytes it may not read, and check every open of them fails with ESTALE. Returns the log."""
    size = 1000
    mine, secret, inner = b"m" * size, b"S" * size, b"R" * size
    src = os.path.join(shared_base, "src")
    outside = os.path.join(shared_base, "outside")
    make_tree(src, {"root_only.bin": inner, "user/a.bin": mine, "user/b.bin": mine, "user/sub/c.bin": mine})
    make_tree(outside, {"secret.bin": secret, "c.bin": secret})
    for p in ("root_only.bin",):
        os.chmod(os.path.join(src, p), 0o600)
    for p in ("secret.bin", "c.bin"):
        os.chmod(os.path.join(outside, p), 0o600)
    user = os.path.join(src, "user")
    for d, _, files in os.walk(user):   # the other user's own corner of the dataset
        os.chown(d, NOBODY, NOBODY)
        for f in files:
            os.chown(os.path.join(d, f), NOBODY, NOBODY)
            os.chmod(os.path.join(d, f), 0o644)
    m = public_mount(src, "--allow-other", *_disk_tier(tmp_path / "cache"))

    def swap():  # after the scan, each of the user's files becomes a path to bytes it may not read
        os.unlink(os.path.join(user, "a.bin"))
        os.symlink(os.path.join(outside, "secret.bin"), os.path.join(user, "a.bin"))   # out of the tree
        os.unlink(os.path.join(user, "b.bin"))
        os.symlink("../root_only.bin", os.path.join(user, "b.bin"))                   # inside: another file
        os.rename(os.path.join(user, "sub"), os.path.join(user, "sub.old"))
        os.symlink(outside, os.path.join(user, "sub"))                                 # a directory swapped

    assert as_nobody(swap) == 0
    for rel in ("user/a.bin", "user/b.bin", "user/sub/c.bin"):
        path = os.path.join(m.path, rel)

        def attempt():
            data = read(path)
            assert data not in (secret, inner), "served the bytes of a file the reader may not read"
        assert as_nobody(attempt) == errno.ESTALE, rel
    log = m.log()
    assert log.count("refused to serve") >= 1 and "outside the source tree" in log
    assert m.stats()["corrupt_entries"] == 0
    return log


def test_a_file_rewritten_in_place_is_read_again_after_a_remount(small_tree, tmp_path, mount):
    src, spec = small_tree
    cache = tmp_path / "cache"
    m = mount(src, *_disk_tier(cache))
    for rel in spec:
        assert read(os.path.join(m.path, rel)) == spec[rel]   # every file in the disk tier
    m.umount()
    dirs = {d: (os.stat(src / d).st_mtime_ns, os.stat(src / d).st_ctime_ns) for d in ("cat", "dog")}
    same_size = bytes(reversed(spec["cat/01.bin"]))
    grown = spec["dog/00.bin"] + b"g" * 333
    with open(src / "cat/01.bin", "r+b") as f:   # in place: the directories' mtimes stay
        f.write(same_size)
    with open(src / "dog/00.bin", "r+b") as f:
        f.write(grown)
    assert {d: (os.stat(src / d).st_mtime_ns, os.stat(src / d).st_ctime_ns) for d in dirs} == dirs
    m.start()
    s = m.stats()
    assert s["namespace"]["from_snapshot"] is True and s["tiers"]["disk"]["files"] == len(spec)
    assert os.stat(os.path.join(m.path, "dog/00.bin")).st_size == len(grown)
    assert read(os.path.join(m.path, "cat/01.bin")) == same_size
    assert read(os.path.join(m.path, "dog/00.bin")) == grown
    for rel in spec:
        if rel not in ("cat/01.bin", "dog/00.bin"):
            assert read(os.path.join(m.path, rel)) == spec[rel]
    s = m.stats()
    assert (s["misses"], s["hits"]["disk"], s["corrupt_entries"]) == (2, len(spec) - 2, 0)
    assert m.log().count("changed at the source since the snapshot") == 2
    m.umount()
    m.start()   # the revised records were saved: both files are disk hits now
    s = m.stats()
    assert s["namespace"]["from_snapshot"] is True
    assert read(os.path.join(m.path, "cat/01.bin")) == same_size
    assert read(os.path.join(m.path, "dog/00.bin")) == grown
    s = m.stats()
    assert (s["misses"], s["hits"]["disk"]) == (0, 2)


FD_LIMIT = 64


def test_running_out_of_descriptors_deletes_no_entry(tmp_path, monkeypatch, fuse_impl):
    n = 120
    spec = {f"c{i % 4}/{i:03d}.bin": bytes([i]) * (100 + i) for i in range(n)}
    src = tmp_path / "src"
    make_tree(src, spec)
    # the CLI starts with RLIMIT_NOFILE 32:64 (soft:hard): the daemon raises its soft limit to 64, no further
    monkeypatch.setattr(_mounts, "SHADEFS", [
        sys.executable, "-c", "import resource, runpy, sys; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({FD_LIMIT // 2}, {FD_LIMIT})); "
        "runpy.run_module('shadefs', run_name='__main__', alter_sys=True)"])
    mp = tmp_path / "mp"
    mp.mkdir()
    # one entry file per entry (--disk-pack-below 0): each open disk hit holds a descriptor of its own (no
    # passthrough; no descriptor reserve, which would serve the opens past it from buffers: test_descriptors)
    m = Mount(src, mp, (*_disk_tier(tmp_path / "cache"), "--disk-pack-below", "0", "--no-passthrough",
                        "--fd-reserve", "0"), tmp_path / "mp.log", fuse_impl=fuse_impl)
    m.start()
    try:
        with open(f"/proc/{m.pid}/limits") as f:
            assert any(line.startswith("Max open files") and line.split()[3:5] == [str(FD_LIMIT)] * 2
                       for line in f)
        for rel, data in spec.items():
            assert read(os.path.join(m.path, rel)) == data
        entries = sum(len(fs) for _, _, fs in os.walk(tmp_path / "cache"))
        held, failed = [], []
        for rel in spec:   # each open disk hit holds its entry's descriptor in the daemon
            try:
                held.append(os.open(os.path.join(m.path, rel), os.O_RDONLY))
            except OSError as e:
                failed.append(e.errno)
        for fd in held:
            os.close(fd)
        # close() returns before the kernel's RELEASE reaches the daemon (it is sent in the background): the
        # descriptors are back once the daemon holds no entry file open (one only while its open is; the
        # cache directory's lock file is held for the mount's life)
        cache = str(tmp_path / "cache")

        def link(fd):
            # "" for a descriptor the daemon closed between the listing and the readlink (a RELEASE we wait for)
            try:
                return os.readlink(f"/proc/{m.pid}/fd/{fd}")
            except FileNotFoundError:
                return ""

        def entry_fds():
            links = (link(fd) for fd in os.listdir(f"/proc/{m.pid}/fd"))
            return sum(1 for p in links if p.startswith(cache + os.sep) and os.path.isfile(p)
                       and os.path.basename(p) != "lock")

        wait_for(lambda: entry_fds() == 0, timeout=60, what="the held opens' RELEASEs")
        s = m.stats()
        assert s["corrupt_entries"] == 0 and s["tiers"]["disk"]["files"] == n
        assert sum(len(fs) for _, _, fs in os.walk(tmp_path / "cache")) == entries
        # the opens past the limit failed with the daemon's own errno, not EIO
        assert failed and set(failed) <= {errno.EMFILE, errno.ENFILE}, failed
        assert s["descriptors"]["failed"] == len(failed) and s["descriptors"]["reserve"] == 0
        before = s["hits"]["disk"]
        for rel, data in spec.items():   # every entry still there: all hits, none read from the source
            assert read(os.path.join(m.path, rel)) == data
            # one at a time: a later OPEN overtakes the earlier RELEASEs, and without a reserve each hit not
            # yet released holds its entry's descriptor
            wait_for(lambda: entry_fds() == 0, timeout=60, what="the RELEASE of " + rel)
        s = m.stats()
        assert (s["hits"]["disk"] - before, s["misses"], s["corrupt_entries"]) == (n, n, 0)
    finally:
        m.umount()

"""What a mount serves of its source (docs/operations.md, "Security"): symlinks inside the tree are
served as their targets, symlinks outside it are skipped unless --follow-symlinks, loops are cut,
permissions and owners are the source's and enforced by the kernel, unreadable parts are skipped,
and every directory appears, empty ones included. Real mounts through the real CLI."""
import os
import subprocess
import time

import pytest

from conftest import SHADEFS, Mount, is_mounted, make_tree
from mountutil import read
from test_security import mount_options, public_mount  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("fuse")  # skipped without /dev/fuse + fusermount3; failed under CI=true

NOBODY = "65534"


def skipped(m) -> dict:
    return m.stats()["namespace"]["skipped"]


def tree_of(root) -> dict:
    """{relative path: kind} of everything below ``root`` ('d' directory, 'f' file), via the mount."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirnames:
            out[os.path.normpath(os.path.join(rel, d))] = "d"
        for f in filenames:
            out[os.path.normpath(os.path.join(rel, f))] = "f"
    return out


def as_nobody_cat(path) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "cat", path],
                          capture_output=True, timeout=30)


@pytest.fixture
def linked_tree(tmp_path):
    """A source with a symlink to a file and one to a directory inside it, two outside it (a secret
    file and a directory), and a dangling one."""
    src = tmp_path / "src"
    make_tree(src, {"cls/a.bin": b"A" * 100, "other/b.bin": b"B" * 200})
    outside = tmp_path / "outside"
    make_tree(outside, {"secret.txt": b"root only", "dir/c.bin": b"C" * 50})
    os.symlink("../other/b.bin", src / "cls" / "link_in.bin")
    os.symlink("../other", src / "cls" / "dirlink_in")
    os.symlink(str(outside / "secret.txt"), src / "cls" / "link_out.txt")
    os.symlink(str(outside / "dir"), src / "cls" / "dirlink_out")
    os.symlink("nowhere", src / "cls" / "dangling")
    return src


def test_symlinks_inside_are_served_as_their_target_outside_skipped(linked_tree, mount):
    m = mount(linked_tree)
    assert tree_of(m.path) == {
        "cls": "d", "cls/a.bin": "f", "cls/link_in.bin": "f", "cls/dirlink_in": "d", "cls/dirlink_in/b.bin": "f",
        "other": "d", "other/b.bin": "f"}
    assert read(os.path.join(m.path, "cls/link_in.bin")) == b"B" * 200
    assert read(os.path.join(m.path, "cls/dirlink_in/b.bin")) == b"B" * 200
    for name in ("link_out.txt", "dirlink_out", "dangling"):
        assert not os.path.lexists(os.path.join(m.path, "cls", name))
    s = skipped(m)
    assert (s["symlinks_outside"], s["symlinks_dangling"], s["loops"], s["unreadable"]) == (2, 1, 0, 0)
    log = m.log()
    warnings = [line for line in log.splitlines() if "pointing outside the source tree" in line]
    assert len(warnings) == 1 and "skipped 2 symlinks" in warnings[0], log


def test_follow_symlinks_serves_targets_outside(linked_tree, mount):
    m = mount(linked_tree, "--follow-symlinks")
    assert read(os.path.join(m.path, "cls/link_out.txt")) == b"root only"
    assert read(os.path.join(m.path, "cls/dirlink_out/c.bin")) == b"C" * 50
    assert skipped(m)["symlinks_outside"] == 0 and skipped(m)["symlinks_dangling"] == 1


def test_symlink_loops_are_cut_and_the_mount_comes_up_in_normal_time(tmp_path, mount):
    src = tmp_path / "src"
    make_tree(src, {"cls/x.bin": b"x" * 10, "cls/sub/y.bin": b"y" * 20})
    os.symlink(".", src / "cls" / "l1")
    os.symlink(".", src / "cls" / "l2")
    os.symlink("..", src / "cls" / "sub" / "up")
    t0 = time.monotonic()
    m = mount(src, "--follow-symlinks")  # loops are cut with or without following symlinks
    assert time.monotonic() - t0 < 30
    assert tree_of(m.path) == {"cls": "d", "cls/x.bin": "f", "cls/sub": "d", "cls/sub/y.bin": "f"}
    assert skipped(m)["loops"] == 3
    assert any("skipped 3 directories that loop back" in line for line in m.log().splitlines()), m.log()


def test_modes_and_owners_are_the_sources_and_the_kernel_enforces_them(tmp_path, public_mount):  # noqa: F811
    src = tmp_path / "src"
    make_tree(src, {"cls/secret.bin": b"s" * 64, "cls/public.bin": b"p" * 64, "cls/group.bin": b"g" * 8})
    os.chmod(tmp_path, 0o755)  # the test's own tmp dir (not what the mount serves)
    os.chmod(src / "cls" / "secret.bin", 0o600)
    os.chmod(src / "cls" / "public.bin", 0o644)
    os.chown(src / "cls" / "group.bin", 1234, 5678)
    os.chmod(src / "cls" / "group.bin", 0o640)
    os.chmod(src / "cls", 0o751)
    m = public_mount(src, "--allow-other")
    assert {"allow_other", "default_permissions"} <= mount_options(m.path)
    st = os.stat(os.path.join(m.path, "cls/secret.bin"))
    assert (oct(st.st_mode), st.st_uid, st.st_gid) == (oct(0o100400), 0, 0)  # write bits cleared: read-only
    st = os.stat(os.path.join(m.path, "cls/group.bin"))
    assert (oct(st.st_mode), st.st_uid, st.st_gid) == (oct(0o100440), 1234, 5678)
    st = os.stat(os.path.join(m.path, "cls"))
    assert (oct(st.st_mode), st.st_uid) == (oct(0o40551), 0)
    r = as_nobody_cat(os.path.join(m.path, "cls/secret.bin"))
    assert r.returncode != 0 and b"Permission denied" in r.stderr and r.stdout == b""
    r = as_nobody_cat(os.path.join(m.path, "cls/public.bin"))
    assert r.returncode == 0 and r.stdout == b"p" * 64
    assert as_nobody_cat(os.path.join(m.path, "cls/group.bin")).returncode != 0
    assert read(os.path.join(m.path, "cls/secret.bin")) == b"s" * 64  # root still reads it


def test_a_symlink_to_a_secret_outside_is_not_readable_by_another_user(tmp_path, public_mount):  # noqa: F811
    """A leak to guard against: a symlink in the source to a root-only file outside it."""
    src = tmp_path / "src"
    make_tree(src, {"cls/ok.bin": b"ok"})
    secret = tmp_path / "secret"
    secret.write_bytes(b"top secret")
    os.chmod(secret, 0o600)
    os.symlink(str(secret), src / "cls" / "leak")
    m = public_mount(src, "--allow-other")
    r = as_nobody_cat(os.path.join(m.path, "cls/leak"))
    assert r.returncode != 0 and r.stdout == b"" and b"No such file" in r.stderr
    m2 = public_mount(src, "--allow-other", "--follow-symlinks")  # followed: still the target's 0600
    r = as_nobody_cat(os.path.join(m2.path, "cls/leak"))
    assert r.returncode != 0 and r.stdout == b"" and b"Permission denied" in r.stderr


class CappedMount(Mount):
    """A mount whose daemon runs as root without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH, so that file
    modes bind it as they bind an unprivileged daemon (or root on a root-squashed NFS export)."""

    def start(self):
        cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *SHADEFS, "mount", self.source,
               self.path, "--log-file", self.log_file, *self.args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr + r.stdout
        self.pid = int(r.stdout.split("(pid ")[1].split(",")[0])
        return self


def test_unreadable_directories_and_files_are_skipped_the_rest_served(tmp_path):
    src = tmp_path / "src"
    make_tree(src, {"good/a.bin": b"a" * 10, "locked/b.bin": b"b" * 10, "good/private.bin": b"p",
                    "noexec/c.bin": b"c"})
    os.chmod(src / "locked", 0o000)
    os.chmod(src / "good" / "private.bin", 0o000)
    os.chmod(src / "noexec", 0o600)  # listable, but its entries cannot be stat'ed
    mp = tmp_path / "mnt"
    mp.mkdir()
    m = CappedMount(src, mp, [], tmp_path / "capped.log")
    try:
        m.start()
        assert tree_of(m.path) == {"good": "d", "good/a.bin": "f", "noexec": "d"}
        assert read(os.path.join(m.path, "good/a.bin")) == b"a" * 10
        assert skipped(m)["unreadable"] == 3  # locked/, good/private.bin, noexec/c.bin
        lines = [line for line in m.log().splitlines() if "may not read" in line]
        assert len(lines) == 1 and "skipped 3 files or directories" in lines[0], m.log()
    finally:
        m.umount()
        for d in ("locked", "noexec"):
            os.chmod(src / d, 0o755)
    assert not is_mounted(str(mp))


def test_empty_directories_appear(tmp_path, mount):
    src = tmp_path / "src"
    make_tree(src, {"a/x.bin": b"x", "c/y.bin": b"y"})
    (src / "b").mkdir()
    (src / "a" / "deep" / "er").mkdir(parents=True)
    m = mount(src)
    assert sorted(os.listdir(m.path)) == ["a", "b", "c"]
    assert os.listdir(os.path.join(m.path, "b")) == []
    assert sorted(os.listdir(os.path.join(m.path, "a"))) == ["deep", "x.bin"]
    assert os.listdir(os.path.join(m.path, "a/deep")) == ["er"]
    assert os.stat(os.path.join(m.path, "a")).st_nlink == 3
    ns = m.stats()["namespace"]
    assert (ns["files"], ns["directories"]) == (2, 6)


def test_skip_counters_in_prometheus(linked_tree, mount):
    from mountutil import metrics_port, scrape

    m = mount(linked_tree, "--metrics-port", "0")
    samples = scrape(metrics_port(m))
    assert samples[("shadefs_namespace_skipped", (("reason", "symlinks_outside"),))] == 2
    assert samples[("shadefs_namespace_skipped", (("reason", "symlinks_dangling"),))] == 1
    assert samples[("shadefs_namespace_directories", ())] == 4
    assert samples[("shadefs_namespace_files", ())] == 4

"""Where ``shadefs mount`` writes, checked before it forks: the default log directory cannot be planted
by another user (a directory or symlink of theirs in the shared temp dir), the log never follows a symlink,
and nothing shadefs writes, nor the mountpoint, lies inside the source it serves."""
from __future__ import annotations

import os
import shutil
import stat
import tempfile

import pytest

from conftest import is_mounted
from shadefs.testing import mounts as _mounts
from shadefs.testing.users import as_nobody

pytestmark = pytest.mark.usefixtures("fuse")


def one_line_error(r, rc=2):
    assert r.returncode == rc, (r.returncode, r.stderr, r.stdout)
    assert r.stderr.count("\n") == 1, r.stderr
    return r.stderr


@pytest.fixture
def shared_tmp():
    """A sticky, world-writable directory like /tmp, for ``$TMPDIR``: every user may create in it."""
    d = tempfile.mkdtemp(prefix="shadefs-tmp-", dir="/tmp")
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def victim(tmp_path):
    """A root-only file a planted symlink points at."""
    v = tmp_path / "root-only"
    v.write_text("root's own\n")
    os.chmod(v, 0o600)
    return v


def _slug(mp) -> str:
    return str(mp).strip("/").replace("/", "_") + ".log"


def _mount_or_cleanup(cli, *args, env=None):
    """Run ``shadefs mount``; a mount it made (on a build without the check) is unmounted again."""
    r = cli("mount", *args, check=False, env=env)
    if r.returncode == 0:
        _mounts.unmount(args[1])
    return r


def _plant_directory(d, target, name):
    """As nobody: the daemon's log directory, made first, world-writable, with a symlink as its log."""
    own = os.path.join(d, "shadefs-0")
    os.mkdir(own)
    os.chmod(own, 0o777)
    os.symlink(target, os.path.join(own, name))


def _plant_symlinked_directory(d, target, name):
    """As nobody: the daemon's log directory name as a symlink to a directory of theirs."""
    own = os.path.join(d, "nobodys")
    os.mkdir(own)
    os.chmod(own, 0o777)
    os.symlink(target, os.path.join(own, name))
    os.symlink(own, os.path.join(d, "shadefs-0"))


@pytest.mark.parametrize("plant,message", [
    (_plant_directory, "{d}/shadefs-0 belongs to uid 65534, not to us (0); refusing to put the log there"),
    (_plant_symlinked_directory, "{d}/shadefs-0 is not a directory (a symlink?); refusing to put the log there"),
])
def test_a_planted_default_log_directory_is_refused(small_tree, tmp_path, cli, shared_tmp, victim, plant,
                                                    message):
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    assert as_nobody(lambda: plant(shared_tmp, str(victim), _slug(mp))) == 0
    r = _mount_or_cleanup(cli, src, mp, env=dict(os.environ, TMPDIR=shared_tmp))
    assert one_line_error(r) == (f"shadefs: error: log directory: {message.format(d=shared_tmp)} "
                                 "(or pass --log-file FILE)\n")
    assert victim.read_text() == "root's own\n" and not is_mounted(mp)


def test_a_default_log_directory_others_can_reach_is_refused(small_tree, tmp_path, cli, shared_tmp):
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    d = os.path.join(shared_tmp, f"shadefs-{os.geteuid()}")
    os.mkdir(d)
    os.chmod(d, 0o777)  # ours, but anyone may plant a symlink in it
    r = _mount_or_cleanup(cli, src, mp, env=dict(os.environ, TMPDIR=shared_tmp))
    assert one_line_error(r) == (f"shadefs: error: log directory: {d} has mode 777, which others can reach; "
                                 f"run 'chmod 700 {d}' or remove it (or pass --log-file FILE)\n")
    assert os.listdir(d) == [] and not is_mounted(mp)


def test_the_default_log_directory_is_created_private(small_tree, tmp_path, cli, shared_tmp):
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    cli("mount", src, mp, env=dict(os.environ, TMPDIR=shared_tmp))
    try:
        d = os.path.join(shared_tmp, f"shadefs-{os.geteuid()}")
        log = os.path.join(d, _slug(mp))
        st = os.lstat(d)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
        st = os.lstat(log)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    finally:
        cli("umount", mp)
    with open(log) as f:
        assert "final stats" in f.read()


@pytest.mark.parametrize("option", ["--log-file", "--trace"])
def test_a_log_or_trace_file_that_is_a_symlink_is_refused(small_tree, tmp_path, cli, victim, option):
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    link = tmp_path / "daemon.out"
    link.symlink_to(victim)
    r = _mount_or_cleanup(cli, src, mp, option, link)
    assert one_line_error(r) == f"shadefs: error: {option} '{link}' is a symlink; give the file it names\n"
    assert victim.read_text() == "root's own\n" and not is_mounted(mp)


# -- nothing shadefs writes inside the source ----------------------------------------------------------
@pytest.mark.parametrize("extra,message", [
    (["--disk-cache", "{src}/.cache", "--disk-cache-size", "1MiB"],
     "the cache directory must not be inside the source"),
    (["--disk-cache", "{tmp}/link/.cache", "--disk-cache-size", "1MiB"],
     "the cache directory must not be inside the source"),  # through a symlink to the source
    (["--disk-cache", "{src}", "--disk-cache-size", "1MiB"], "the cache directory must not be inside the source"),
    (["--disk-cache", "{tmp}", "--disk-cache-size", "1MiB"], "the source must not be inside the cache directory"),
    (["--trace", "{src}/trace.csv"], "the --trace file must not be inside the source"),
    (["--log-file", "{src}/cat/x.log"], "the --log-file must not be inside the source"),
])
def test_what_shadefs_writes_is_refused_inside_the_source(small_tree, tmp_path, cli, extra, message):
    src, spec = small_tree
    (tmp_path / "link").symlink_to(src)
    mp = tmp_path / "mp"
    mp.mkdir()
    before = sorted(os.path.relpath(os.path.join(d, n), src) for d, ds, fs in os.walk(src) for n in ds + fs)
    r = _mount_or_cleanup(cli, src, mp, *[a.format(src=src, tmp=tmp_path) for a in extra])
    assert one_line_error(r) == f"shadefs: error: {message}\n"
    after = sorted(os.path.relpath(os.path.join(d, n), src) for d, ds, fs in os.walk(src) for n in ds + fs)
    assert after == before and not is_mounted(mp)


def test_a_mountpoint_inside_the_source_is_refused(small_tree, tmp_path, cli):
    src, _ = small_tree
    mp = src / "mnt"
    mp.mkdir()
    r = _mount_or_cleanup(cli, src, mp, "--log-file", tmp_path / "x.log")
    assert one_line_error(r) == "shadefs: error: the mountpoint must not be inside the source\n"
    assert not is_mounted(mp)
    r = _mount_or_cleanup(cli, f"file://{src}", mp, "--log-file", tmp_path / "x.log")
    assert one_line_error(r) == "shadefs: error: the mountpoint must not be inside the source\n"

"""Security properties of a live mount: a private control socket, loopback-only TCP unless asked,
a read-only mount, no access for other users unless --allow-other, paths that cannot escape."""
import errno
import os
import shutil
import stat
import tempfile

import pytest

from conftest import Mount, is_mounted
from mountutil import read
from shadefs.testing.users import as_nobody

pytestmark = [pytest.mark.usefixtures("fuse"),  # skipped without /dev/fuse + fusermount3; failed under CI=true
              pytest.mark.both_frontends]  # every test that mounts runs on both front ends


def mount_options(path) -> set:
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if parts[1] == os.path.realpath(str(path)):
                return set(parts[3].split(","))
    raise AssertionError(f"{path} is not mounted")


def test_control_socket_is_0600_inside_a_0700_directory(small_tree, mount):
    src, _ = small_tree
    m = mount(src)
    endpoint = os.getxattr(m.path, "user.shadefs.endpoint").decode()
    assert endpoint.startswith("ipc://")
    sock = endpoint[len("ipc://"):]
    st = os.stat(sock)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    d = os.stat(os.path.dirname(sock))
    assert stat.S_IMODE(d.st_mode) == 0o700 and d.st_uid == os.getuid()


@pytest.mark.parametrize("url", ["tcp://0.0.0.0:0", "tcp://*:0", "tcp://[::]:0", "tcp://example.com:5555"])
def test_tcp_control_is_refused_off_loopback(small_tree, tmp_path, cli, url):
    src, _ = small_tree
    mp = tmp_path / "mp"
    mp.mkdir()
    r = cli("mount", src, mp, "--control", url, check=False)
    assert r.returncode == 2 and "loopback" in r.stderr and r.stderr.count("\n") == 1
    assert not is_mounted(mp)


def test_tcp_control_on_loopback_and_remote_only_when_asked(small_tree, mount):
    src, _ = small_tree
    m = mount(src, "--control", "tcp://127.0.0.1:0")
    assert os.getxattr(m.path, "user.shadefs.endpoint").decode().startswith("tcp://127.0.0.1:")
    m2 = mount(src, "--control", "tcp://0.0.0.0:0", "--control-allow-remote")
    assert os.getxattr(m2.path, "user.shadefs.endpoint").decode().startswith("tcp://0.0.0.0:")
    assert "(CURVE: clients need this mount's credentials" in m2.log()  # authenticated by default


def test_the_mount_is_read_only(small_tree, mount):
    src, spec = small_tree
    m = mount(src)
    assert "ro" in mount_options(m.path)
    assert os.statvfs(m.path).f_flag & os.ST_RDONLY
    f = os.path.join(m.path, "cat/01.bin")
    attempts = [
        lambda: os.open(f, os.O_WRONLY), lambda: os.open(f, os.O_RDWR), lambda: os.open(f, os.O_RDONLY | os.O_TRUNC),
        lambda: os.open(os.path.join(m.path, "new.bin"), os.O_WRONLY | os.O_CREAT, 0o644),
        lambda: os.mkdir(os.path.join(m.path, "newdir")), lambda: os.rmdir(os.path.join(m.path, "cat")),
        lambda: os.unlink(f), lambda: os.rename(f, os.path.join(m.path, "cat/x.bin")),
        lambda: os.chmod(f, 0o777), lambda: os.chown(f, 1, 1), lambda: os.utime(f, (0, 0)),
        lambda: os.truncate(f, 0), lambda: os.symlink("/etc/passwd", os.path.join(m.path, "link")),
        lambda: os.link(f, os.path.join(m.path, "hard")), lambda: os.setxattr(f, "user.x", b"1"),
    ]
    for attempt in attempts:
        with pytest.raises(OSError) as e:
            attempt()
        assert e.value.errno == errno.EROFS
    assert read(f) == spec["cat/01.bin"]  # and reading still works


@pytest.fixture
def public_mount(tmp_path, fuse_impl):
    """``public_mount(source, *args) -> Mount`` at a mountpoint every user can reach (pytest's tmp_path is
    0700, which would lock other users out before FUSE is asked)."""
    base = tempfile.mkdtemp(prefix="shadefs-sec-", dir="/tmp")
    os.chmod(base, 0o755)
    mounts = []

    def _mount(source, *args):
        mp = os.path.join(base, f"mnt{len(mounts)}")
        os.mkdir(mp)
        m = Mount(source, mp, args, tmp_path / f"public{len(mounts)}.log", fuse_impl=fuse_impl)
        mounts.append(m)
        return m.start()

    yield _mount
    for m in mounts:
        m.umount()
    shutil.rmtree(base, ignore_errors=True)


def test_other_users_are_locked_out_unless_allow_other(small_tree, public_mount):
    src, spec = small_tree
    m = public_mount(src)
    assert "allow_other" not in mount_options(m.path)
    assert as_nobody(lambda: os.stat(os.path.dirname(m.path))) == 0  # the path is reachable ...
    assert as_nobody(lambda: os.listdir(m.path)) == errno.EACCES     # ... the mount is not
    assert as_nobody(lambda: read(os.path.join(m.path, "cat/01.bin"))) == errno.EACCES
    m2 = public_mount(src, "--allow-other")
    assert "allow_other" in mount_options(m2.path)
    assert as_nobody(lambda: read(os.path.join(m2.path, "cat/01.bin"))) == 0
    assert as_nobody(lambda: os.open(os.path.join(m2.path, "cat/01.bin"), os.O_WRONLY)) == errno.EROFS


def test_paths_cannot_escape_the_snapshot(small_tree, mount):
    src, spec = small_tree
    m = mount(src, "--ram-cache", "1MiB")
    # the kernel resolves '..' before FUSE sees a path: it never leaves the mount through us
    assert read(os.path.join(m.path, "cat/../dog/00.bin")) == spec["dog/00.bin"]
    assert os.path.realpath(os.path.join(m.path, "..")) == os.path.dirname(m.path)
    import zmq

    from shadefs.control import protocol as P
    from shadefs.control.client import ControlClient, find_endpoint

    # every path that is not a snapshot key, asked of the LIVE daemon (a raw socket: the client would
    # refuse to send them): each request is rejected as bad_path, and the daemon keeps serving
    bad_paths = ("../etc/passwd", "cat/../dog/00.bin", "cat//01.bin", "./cat/01.bin", "cat/..", "/etc/passwd",
                 "cat/01.bin/", "..")
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(find_endpoint(m.path))
    try:
        for bad in bad_paths:
            rid = P.new_request_id()
            sock.send_multipart([P.VERSION, P.RESIDENT, rid, bad.encode()])
            assert sock.poll(10_000), f"no reply to a resident request for {bad!r}"
            reply = P.decode_reply(sock.recv_multipart())
            assert isinstance(reply, P.ErrorReply) and reply.request_id == rid, (bad, reply)
            assert reply.reason == "bad_path", (bad, reply.message)
        for bad in ("../etc/passwd", "cat/../dog/00.bin"):  # one-way scores: counted, never applied
            sock.send_multipart([P.VERSION, P.SCORES, P._encode_paths([bad], P.MAX_PATHS), b"\x00\x00\x80\x3f"])
    finally:
        sock.close()
    with ControlClient(find_endpoint(m.path)) as c:
        with pytest.raises(P.ProtocolError):  # the client refuses to send such a path
            c.send_scores(["../etc/passwd"], [1.0])
        assert c.resident(["cat/01.bin", "dog/00.bin"]).tolist() == [False, True]  # still serving (dog/00 read above)
        stats = c.stats()
    assert stats["scores_rejected"]["bad_path"] == len(bad_paths) + 2 and stats["scores_received"] == 0

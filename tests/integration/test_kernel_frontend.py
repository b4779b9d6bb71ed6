"""What only the kernel front end does: FUSE passthrough for NVMe hits (with opens of one file in one io
mode), INIT negotiation logged once, mounting as a non-root user through fusermount3's fd passing."""
import os
import re
import shutil
import signal
import stat
import tempfile

import pytest

from conftest import is_mounted
from mountutil import read, wait_for
from shadefs.testing.handles import memory_handle
from shadefs.testing.users import NOBODY, as_nobody, fork_as_nobody, wait_exit_code

pytestmark = pytest.mark.usefixtures("fuse")


def _passthrough_opens(log: str) -> int:
    found = re.findall(r"kernel front end: (\d+) opens answered by passthrough", log)
    assert found, log
    return int(found[-1])


def test_nvme_hits_are_served_by_passthrough_and_counted_per_open(small_tree, mount, tmp_path):
    src, spec = small_tree
    m = mount(src, "--fuse-impl", "kernel", "--ram-cache", "0", "--disk-cache", tmp_path / "cache",
              "--disk-cache-size", "100%", "--no-kernel-cache")
    for _ in range(3):
        for rel, data in sorted(spec.items()):
            assert read(os.path.join(m.path, rel)) == data
    s = m.stats()
    assert s["opens"] == 30 and s["misses"] == 10 and s["hits"]["disk"] == 20
    m.umount()
    log = m.log()
    assert len(re.findall(r"FUSE kernel protocol 7\.\d+ \(kernel offers 7\.\d+\)", log)) == 1
    if "passthrough on" not in log:
        pytest.skip("this kernel does not offer FUSE passthrough: " + log[log.find("passthrough"):][:120])
    # every NVMe hit, and every miss too: a miss is written into the NVMe tier before it is served, so its
    # handle has the just-written entry as backing file (counted as a miss all the same, above)
    assert _passthrough_opens(log) == 30


def test_passthrough_and_cached_opens_of_one_file_never_mix(small_tree, mount, tmp_path):
    """A file open by passthrough (an NVMe hit) that is promoted to RAM meanwhile: the next open of it is a
    RAM hit but must use the same backing file (the kernel refuses a cached open of a passthrough inode
    with EIO)."""
    src, spec = small_tree
    m = mount(src, "--fuse-impl", "kernel", "--ram-cache", "3000", "--policy", "lru",
              "--disk-cache", tmp_path / "cache", "--disk-cache-size", "100%")
    p00, p02 = os.path.join(m.path, "dog/00.bin"), os.path.join(m.path, "dog/02.bin")
    assert read(p00) == spec["dog/00.bin"]   # miss -> RAM
    assert read(p02) == spec["dog/02.bin"]   # miss -> RAM (3000 B), 00 demoted to the disk tier
    assert m.stats()["tiers"]["disk"]["files"] == 1
    fd1 = os.open(p00, os.O_RDONLY)          # NVMe hit (passthrough), promoted to RAM
    try:
        assert m.stats()["hits"]["disk"] == 1
        fd2 = os.open(p00, os.O_RDONLY)      # RAM hit while fd1 is open: same io mode
        try:
            assert os.read(fd2, 1 << 20) == spec["dog/00.bin"]
            assert os.read(fd1, 1 << 20) == spec["dog/00.bin"]
        finally:
            os.close(fd2)
    finally:
        os.close(fd1)
    assert read(p00) == spec["dog/00.bin"]   # after both are released: a plain RAM hit
    s = m.stats()
    assert (s["hits"]["ram"], s["hits"]["disk"], s["misses"]) == (2, 1, 2)


@pytest.fixture
def dev_fuse_for_everyone():
    """/dev/fuse usable by other users for the test (Debian's udev makes it 0666; a container's may be
    0600): its mode is widened to 0666 and restored afterwards."""
    mode = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
    if mode & 0o006 != 0o006:
        os.chmod("/dev/fuse", 0o666)
    yield
    os.chmod("/dev/fuse", mode)


def test_a_non_root_user_mounts_through_fusermount3(tmp_path, dev_fuse_for_everyone):
    from conftest import require

    require("fusermount3")
    from shadefs.backends.posix import PosixBackend
    from shadefs.fuse.kernel import KernelFrontend
    from shadefs.namespace import Namespace

    base = tempfile.mkdtemp(prefix="shadefs-user-", dir="/tmp")
    try:
        os.chmod(base, 0o755)
        src, mp = os.path.join(base, "src"), os.path.join(base, "mnt")
        os.makedirs(os.path.join(src, "d"))
        data = os.urandom(5000)
        with open(os.path.join(src, "d", "f.bin"), "wb") as f:
            f.write(data)
        os.mkdir(mp)
        os.chown(mp, NOBODY, NOBODY)
        for p in (src, os.path.join(src, "d")):
            os.chmod(p, 0o755)
        ns = Namespace(PosixBackend(src).walk())

        class Cache:
            def open_nowait(self, fid):
                return memory_handle(data, "ram")

            open = open_nowait

        def serve():
            KernelFrontend(ns, Cache(), None, mountpoint=mp, fsname="shadefs-user-test", passthrough=False).run()

        server = fork_as_nobody(serve)
        try:
            wait_for(lambda: is_mounted(mp), timeout=20)
            with open("/proc/self/mounts") as f:
                line = next(ln for ln in f if ln.split()[1] == mp)
            assert line.split()[0] == "shadefs-user-test" and line.split()[2] == "fuse.shadefs"
            opts = set(line.split()[3].split(","))
            assert {"ro", "nosuid", "nodev", f"user_id={NOBODY}", f"group_id={NOBODY}",
                    "default_permissions"} <= opts

            def read_as_nobody():
                assert read(os.path.join(mp, "d", "f.bin")) == data

            assert as_nobody(read_as_nobody) == 0
        finally:
            os.kill(server, signal.SIGTERM)  # unmounts through fusermount3 -u -z, then exits
            code = wait_exit_code(server)
        assert code == 0
        assert not is_mounted(mp)
    finally:
        if is_mounted(os.path.join(base, "mnt")):
            os.system(f"fusermount3 -uz {os.path.join(base, 'mnt')}")
        shutil.rmtree(base, ignore_errors=True)

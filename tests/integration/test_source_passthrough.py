"""Opens served from a directory source answered by FUSE passthrough to the source file, through real
mounts (kernel front end): the kernel reads the source file itself (no READ reaches the daemon, no byte is
read by it), every open is still counted, a file a tier would cache is still cached, and a source file
that is refused or changed is refused at the open."""
import errno
import mmap
import os
import random
import re

import pytest

from shadefs.cache.chunks import CHUNK

pytestmark = pytest.mark.usefixtures("fuse")

AUDIT = dict(os.environ, SHADEFS_AUDIT="1")
BIG = 2 * CHUNK + CHUNK // 2  # a chunked file: chunks of CHUNK, CHUNK and CHUNK / 2 bytes


def _tree(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(9)
    spec = {"big.bin": rng.randbytes(BIG), "small.bin": rng.randbytes(300_000)}
    for rel, data in spec.items():
        (src / rel).write_bytes(data)
    return src, spec


def _kernel(mount, src, *args, env=None):
    # --source-passthrough untiered is the default of a directory source
    return mount(src, "--fuse-impl", "kernel", *args, env=env)


def _source_opens(m) -> int:
    """Opens the unmounted ``m``'s kernel front end answered by passthrough to the source file (its log);
    skips where the kernel gave no passthrough."""
    log = m.log()
    if "passthrough on" not in log:
        pytest.skip("this kernel does not offer FUSE passthrough: " + log[log.find("passthrough"):][:120])
    found = re.findall(r"opens answered by passthrough \(\d+ of them NVMe hits on a kept backing id, without "
                       r"opening the entry; (\d+) to the source file\)", log)
    assert found, log
    return int(found[-1])


def _records(path, data, offsets, mapped=True, willneed=False):
    fd = os.open(path, os.O_RDONLY)
    try:
        if willneed:  # as pyarrow does before it reads a column chunk or row group
            for off in offsets[:20]:
                os.posix_fadvise(fd, off, 2 << 20, os.POSIX_FADV_WILLNEED)
        for off in offsets:
            assert os.pread(fd, 10_000, off) == data[off:off + 10_000]
        if mapped:
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mm:
                for off in offsets[::7]:
                    assert mm[off:off + 100] == data[off:off + 100]
    finally:
        os.close(fd)


def test_an_untiered_file_is_read_by_the_kernel_from_the_source_file(tmp_path, mount):
    """A file no tier admits (no RAM tier): each open is counted as a miss and answered by passthrough to
    the source file; its bytes are the source's and the daemon reads none of them (no READ reaches it).
    With --source-passthrough off the same opens are served by the daemon (it reads the file)."""
    src, spec = _tree(tmp_path)
    data = spec["small.bin"]
    offsets = random.Random(1).sample(range(0, len(data) - 10_000, 512), 40)
    m = _kernel(mount, src, "--ram-cache", "0", env=AUDIT)
    p = os.path.join(m.path, "small.bin")
    for _ in range(3):
        _records(p, data, offsets)
        with open(p, "rb") as f:
            assert f.read() == data
    s = m.full_stats()
    c = s["audit"]["counters"]
    assert (s["opens"], s["misses"], c["streamed"], c["backend_reads"], c["range_reads"]) == (6, 6, 6, 0, 0)
    # the kernel may read the whole file at each of the six opens; the daemon read none of it
    assert (s["backend_bytes"], s["source_passthrough_bytes"]) == (0, 6 * len(data))
    m.umount()
    assert _source_opens(m) == 6

    off = _kernel(mount, src, "--ram-cache", "0", "--source-passthrough", "off")
    with open(os.path.join(off.path, "small.bin"), "rb") as f:
        assert f.read() == data
    s = off.stats()
    assert (s["opens"], s["misses"], s["backend_bytes"], s["source_passthrough_bytes"]) == (1, 1, len(data), 0)
    off.umount()
    assert "passthrough off (no NVMe tier, and no passthrough to the source" in off.log()


def test_a_chunked_file_no_tier_can_take_is_read_from_the_source_file(tmp_path, mount):
    """Random records of a chunked file over a tier smaller than a chunk (HDF5, LMDB, an mmap'd array), with
    ``posix_fadvise(WILLNEED)`` of ranges first (pyarrow's): every open is counted once, as a miss of the
    file, and no chunk is opened or read by the daemon (the read-ahead READs that advice still sends to the
    daemon are served from the source file the open checked)."""
    src, spec = _tree(tmp_path)
    data = spec["big.bin"]
    offsets = random.Random(2).sample(range(0, BIG - 10_000, 4096), 200)
    m = _kernel(mount, src, "--ram-cache", "64KiB", env=AUDIT)
    p = os.path.join(m.path, "big.bin")
    for e in range(3):
        _records(p, data, random.Random(e).sample(offsets, len(offsets)), willneed=True)
    s = m.full_stats()
    c = s["audit"]["counters"]
    assert (s["opens"], s["misses"], c["streamed"], c["range_reads"], c["backend_reads"]) == (3, 3, 3, 0, 0)
    assert s["backend_bytes"] == 0 and s["tiers"]["ram"]["files"] == 0
    # the file's size at each open (the read-ahead READs the daemon served from it are within those)
    assert s["source_passthrough_bytes"] == 3 * BIG
    m.umount()
    assert _source_opens(m) == 3


def test_a_chunked_file_a_tier_takes_is_cached_unless_large(tmp_path, mount):
    """Under untiered, a chunked file the RAM tier takes is read into it by chunks and its
    later opens are RAM hits of its chunks, never passthrough to the source; under ``large`` every open
    of it goes to the source file and nothing of it is cached."""
    src, spec = _tree(tmp_path)
    data = spec["big.bin"]
    offsets = list(range(0, BIG - 10_000, CHUNK // 4))
    m = _kernel(mount, src, "--ram-cache", str(4 * CHUNK), "--no-kernel-cache")
    p = os.path.join(m.path, "big.bin")
    for _ in range(2):
        _records(p, data, offsets, mapped=False)
    s = m.stats()
    assert s["tiers"]["ram"]["files"] == 3 and s["backend_bytes"] == BIG and s["source_passthrough_bytes"] == 0
    assert (s["misses"], s["hits"]["ram"]) == (3, 3)  # each chunk opened once per open of the file
    m.umount()
    assert _source_opens(m) == 0

    big = _kernel(mount, src, "--ram-cache", str(4 * CHUNK), "--source-passthrough", "large")
    for _ in range(2):
        _records(os.path.join(big.path, "big.bin"), data, offsets)
    s = big.stats()
    assert (s["opens"], s["misses"], s["backend_bytes"], s["tiers"]["ram"]["files"]) == (2, 2, 0, 0)
    assert s["source_passthrough_bytes"] == 2 * BIG
    big.umount()
    assert _source_opens(big) == 2


def test_no_passthrough_turns_passthrough_to_the_source_off(tmp_path, mount):
    src, spec = _tree(tmp_path)
    m = _kernel(mount, src, "--ram-cache", "0", "--no-passthrough")
    with open(os.path.join(m.path, "small.bin"), "rb") as f:
        assert f.read() == spec["small.bin"]
    s = m.stats()
    assert (s["backend_bytes"], s["source_passthrough_bytes"]) == (len(spec["small.bin"]), 0)
    m.umount()
    assert "passthrough off (--no-passthrough)" in m.log()


def test_a_refused_or_changed_source_file_is_refused_at_the_open(tmp_path, mount):
    """The source file is opened beneath the root with no symlink followed and checked against the
    snapshot (inode, size, mtime) before the kernel is given it: a symlink swapped in is refused (ESTALE),
    a file whose mtime changed is refused (EIO), and nothing of either is read."""
    src, spec = _tree(tmp_path)
    (src / "other.bin").write_bytes(b"x" * 300_000)
    m = _kernel(mount, src, "--ram-cache", "0")
    small, big = os.path.join(m.path, "small.bin"), os.path.join(m.path, "big.bin")
    assert os.path.getsize(small) == 300_000  # looked up (the kernel caches the snapshot's attributes)
    assert os.path.getsize(big) == BIG
    os.unlink(src / "small.bin")
    os.symlink("other.bin", src / "small.bin")
    st = os.stat(src / "big.bin")
    os.utime(src / "big.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(OSError) as e:
        os.open(small, os.O_RDONLY)
    assert e.value.errno == errno.ESTALE
    with pytest.raises(OSError) as e:
        os.open(big, os.O_RDONLY)
    assert e.value.errno == errno.EIO
    s = m.stats()
    assert (s["backend_bytes"], s["source_passthrough_bytes"]) == (0, 0)  # a refused open counts no bytes
    m.umount()
    assert _source_opens(m) == 0

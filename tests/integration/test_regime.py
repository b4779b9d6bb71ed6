"""The regime rig (shadefs.testing.regime): a reader in a memory cgroup keeps at most its limit of a
larger file's pages; the dropping loader leaves none of a file's pages behind."""
from __future__ import annotations

import ctypes
import mmap
import os
import subprocess
import sys

import pytest

from shadefs.testing.regime import MemoryCgroup, cgroup_unavailable, describe, read_dropping

PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_pages(path: str) -> int:
    """How many of ``path``'s pages the kernel's page cache holds now (mmap + mincore; the mapping
    itself faults no page in)."""
    size = os.path.getsize(path)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = (ctypes.c_ubyte * ((size + PAGE - 1) // PAGE))()
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return sum(v & 1 for v in vec)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def _write(path: str, size: int) -> None:
    with open(path, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())  # written back: clean pages can be dropped and reclaimed


def test_the_dropping_reader_leaves_no_page_of_the_file(tmp_path):
    p = str(tmp_path / "f")
    _write(p, 3 * 2**20)
    with open(p, "rb") as f:
        f.read()
    assert resident_pages(p) == 3 * 2**20 // PAGE
    assert len(read_dropping(p)) == 3 * 2**20
    assert resident_pages(p) == 0


def test_a_reader_in_a_memory_cgroup_keeps_at_most_its_limit_of_pages(tmp_path, request):
    why = cgroup_unavailable()
    if why:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(why)
        pytest.skip(why)
    # on the root disk, not tmpfs (tmpfs pages are not reclaimable without swap)
    d = tmp_path / "big"
    d.mkdir()
    p = str(d / "f")
    _write(p, 96 * 2**20)
    # drop what writing left, so every page the reader has comes from its own reads
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    limit = 48 * 2**20
    with MemoryCgroup(limit) as cg:
        code = f"f = open({p!r}, 'rb')\nwhile f.read(1 << 20): pass\n"
        r = subprocess.run([sys.executable, "-c", code], preexec_fn=cg.enter_self, timeout=120)
        assert r.returncode == 0
        assert cg.peak_bytes() <= limit
        held = resident_pages(p) * PAGE
        assert held <= limit                         # the rest was reclaimed within the reader's cgroup
        assert held < 96 * 2**20
        assert cg.pids() == []
        path = cg.path
    assert not os.path.exists(path)                  # removed on exit
    assert "2.0x the reader's memory" in describe("cgroup", limit, 96 * 2**20)

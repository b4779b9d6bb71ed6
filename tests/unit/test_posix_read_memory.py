"""A RAM fill reads a file into one buffer: the posix backend's whole-file read allocates the file's bytes
once (the buffer the RAM tier keeps), never a second copy while filling."""
import os
import tracemalloc

from shadefs.backends.posix import PosixBackend


def test_a_whole_file_read_allocates_its_bytes_once(tmp_path):
    size = 24 << 20
    (tmp_path / "src").mkdir()
    data = os.urandom(size)
    (tmp_path / "src" / "big.bin").write_bytes(data)
    del data
    b = PosixBackend(str(tmp_path / "src"))
    tracemalloc.start()
    try:
        out = b.read("big.bin", size)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(out) == size
    assert peak < size + (1 << 20), f"peak {peak} B for a {size}-byte file: a second copy"
    assert out == (tmp_path / "src" / "big.bin").read_bytes()

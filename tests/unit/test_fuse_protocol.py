"""The kernel front end's wire format, opcode by opcode, against byte vectors written from linux/fuse.h.

The front end's reader loop runs on one end of a SOCK_SEQPACKET socketpair (one write = one message, like
/dev/fuse); the test writes requests byte for byte and compares every reply with the bytes fuse.h says
the kernel expects. A real namespace, cache and posix backend sit behind it.
"""
import errno
import os
import socket
import struct
import threading

import pytest

from shadefs.backends.posix import PosixBackend
from shadefs.cache.core import TieredCache
from shadefs.cache.index import TierIndex
from shadefs.cache.tiers import MemoryTier
from shadefs.fuse import protocol as P
from shadefs.fuse.kernel import KernelFrontend
from shadefs.namespace import Namespace
from shadefs.policies import Importance, get_policy
from shadefs.testing import wait_for

MTIME_NS = 1_600_000_000_500_000_000
UID, GID = os.getuid(), os.getgid()


def in_header(length, opcode, unique, nodeid, uid=0, gid=0, pid=1234):
    # struct fuse_in_header: u32 len, u32 opcode, u64 unique, u64 nodeid, u32 uid, u32 gid, u32 pid,
    # u16 total_extlen, u16 padding  (40 bytes, little-endian on this machine)
    return struct.pack("<IIQQIIIHH", length, opcode, unique, nodeid, uid, gid, pid, 0, 0)


def out_header(length, error, unique):
    # struct fuse_out_header: u32 len, s32 error, u64 unique (16 bytes)
    return struct.pack("<IiQ", length, error, unique)


def attr(ino, mode, size, nlink, mtime_ns=MTIME_NS):
    # struct fuse_attr: u64 ino size blocks atime mtime ctime; u32 atimensec mtimensec ctimensec mode nlink
    # uid gid rdev blksize flags (88 bytes)
    s, ns = divmod(mtime_ns, 10**9)
    return struct.pack("<QQQQQQIIIIIIIIII", ino, size, (size + 511) // 512, s, s, s, ns, ns, ns, mode, nlink,
                       UID, GID, 0, 4096, 0)


def entry_out(nodeid, a, valid=3600):
    # struct fuse_entry_out: u64 nodeid generation entry_valid attr_valid; u32 entry_valid_nsec attr_valid_nsec
    return struct.pack("<QQQQII", nodeid, 0, valid, valid if nodeid else 0, 0, 0) + a


class Daemon:
    endpoint = "ipc:///run/shadefs/x.sock"


@pytest.fixture(params=["compiled loop", "Python loop"])
def wire(tmp_path, request):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.bin").write_bytes(b"hello")
    (src / "b.txt").write_bytes(b"abc")
    for p in (src / "a" / "x.bin", src / "b.txt"):
        os.utime(p, ns=(MTIME_NS, MTIME_NS))
    backend = PosixBackend(str(src))
    ns = Namespace(backend.walk())
    imp = Importance(ns.num_files)
    ram = (TierIndex("ram", 1 << 20, get_policy("lru")(1 << 20, imp)), MemoryTier())
    cache = TieredCache(ns, backend, ram, None, imp)
    fe = KernelFrontend(ns, cache, Daemon(), mountpoint=str(tmp_path / "mnt"), passthrough=False)
    fe.check_replies = True
    fe.compiled_loop = request.param == "compiled loop"
    kernel, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    kernel.settimeout(10)
    w = Wire(fe, kernel, server, ns, src)
    yield w
    fe._stop.set()
    kernel.close()
    server.close()


class Wire:
    def __init__(self, fe, kernel, server, ns, src):
        self.fe, self.kernel, self.server, self.ns, self.src = fe, kernel, server, ns, src
        self.thread = None

    def start(self):
        self.thread = threading.Thread(target=self.fe._reader, args=(self.server.fileno(),), daemon=True)
        self.thread.start()

    def send(self, opcode, unique, nodeid, body=b""):
        self.kernel.send(in_header(40 + len(body), opcode, unique, nodeid) + body)

    def recv(self):
        return self.kernel.recv(1 << 20)

    def call(self, opcode, unique, nodeid, body=b""):
        self.send(opcode, unique, nodeid, body)
        return self.recv()


def test_ioctl_numbers_and_struct_sizes():
    assert (P.DEV_IOC_CLONE, P.DEV_IOC_BACKING_OPEN, P.DEV_IOC_BACKING_CLOSE) == (0x8004E500, 0x4010E501, 0x4004E502)
    assert P.BACKING_MAP.pack(7, 0, 0) == bytes.fromhex("07000000" "00000000" "0000000000000000")
    assert (P.IN_HEADER.size, P.OUT_HEADER.size, P.ENTRY_OUT_SIZE, P.ATTR_OUT_SIZE) == (40, 16, 128, 104)


def test_in_header_decodes_field_by_field():
    raw = bytes.fromhex("38000000" "01000000" "0200000000000000" "0100000000000000"
                        "e8030000" "e9030000" "d2040000" "0000" "0000")
    assert P.decode_in_header(raw) == (56, P.LOOKUP, 2, 1, 1000, 1001, 1234, 0)
    assert P.out_header(0, errno.ENOENT, 2) == bytes.fromhex("10000000" "feffffff" "0200000000000000")


def test_init_negotiates_minor_and_features(wire):
    # struct fuse_init_in (7.36+): major minor max_readahead flags flags2 unused[11]
    kflags = P.ASYNC_READ | P.DO_READDIRPLUS | P.PARALLEL_DIROPS | P.MAX_PAGES | P.INIT_EXT | P.WRITEBACK_CACHE
    body = struct.pack("<IIIII44x", 7, 45, 131072, kflags & 0xFFFFFFFF, P.PASSTHROUGH >> 32)
    wire.send(P.INIT, 1, 0, body)
    wire.fe._serve_init(wire.server.fileno())
    got = wire.recv()
    want_flags = P.ASYNC_READ | P.DO_READDIRPLUS | P.PARALLEL_DIROPS | P.MAX_PAGES | P.INIT_EXT
    # struct fuse_init_out: major minor max_readahead flags; u16 max_background congestion_threshold;
    # u32 max_write time_gran; u16 max_pages map_alignment; u32 flags2 max_stack_depth; unused[6]
    want = out_header(16 + 64, 0, 1) + struct.pack("<IIIIHHIIHHII24x", 7, 41, 131072, want_flags, 64, 48, 4096, 1,
                                                  256, 0, 0, 0)
    assert got == want
    assert wire.fe.proto_minor == 41 and not wire.fe.passthrough  # passthrough=False: flags2 stays 0


def test_init_with_an_older_kernel_answers_its_minor(wire):
    wire.send(P.INIT, 1, 0, struct.pack("<IIII", 7, 31, 65536, P.ASYNC_READ))  # 7.31: 16-byte init_in
    wire.fe._serve_init(wire.server.fileno())
    got = wire.recv()
    assert struct.unpack_from("<II", got, 16) == (7, 31)
    assert struct.unpack_from("<I", got, 16 + 12)[0] == P.ASYNC_READ


def test_lookup_getattr_and_negative_entries(wire):
    wire.start()
    ns = wire.fe.ns
    root, dir_a = ns.root, ns.lookup("a")
    assert (root, dir_a) == (2, 3)   # files 0..1, then directories: root, a
    got = wire.call(P.LOOKUP, 10, 1, b"b.txt\x00")
    assert got == out_header(16 + 128, 0, 10) + entry_out(3, attr(3, 0o100444, 3, 1))
    dir_mtime = int(ns.mount_time * 1e9)
    got = wire.call(P.LOOKUP, 11, 1, b"a\x00")
    assert got == out_header(16 + 128, 0, 11) + entry_out(5, attr(5, 0o040555, 0, 2, dir_mtime))
    got = wire.call(P.LOOKUP, 12, 5, b"x.bin\x00")
    assert got == out_header(144, 0, 12) + entry_out(2, attr(2, 0o100444, 5, 1))
    # absent: a negative entry (nodeid 0) the kernel caches, not an error
    assert wire.call(P.LOOKUP, 13, 1, b"nope\x00") == out_header(144, 0, 13) + entry_out(0, bytes(88))
    assert wire.call(P.LOOKUP, 14, 2, b"x\x00") == out_header(144, 0, 14) + entry_out(0, bytes(88))  # below a file
    # struct fuse_getattr_in: u32 getattr_flags, u32 dummy, u64 fh; fuse_attr_out: u64 attr_valid, u32 nsec, u32 dummy
    got = wire.call(P.GETATTR, 15, 2, struct.pack("<IIQ", 0, 0, 0))
    assert got == out_header(16 + 104, 0, 15) + struct.pack("<QII", 3600, 0, 0) + attr(2, 0o100444, 5, 1)
    root_attr = attr(1, 0o040555, 0, 3, dir_mtime)  # nlink 2 + one subdirectory
    assert wire.call(P.GETATTR, 16, 1, bytes(16)) == out_header(120, 0, 16) + struct.pack("<QII", 3600, 0, 0) + root_attr
    assert wire.call(P.GETATTR, 17, 4, bytes(16)) == out_header(16, -errno.ENOENT, 17)   # nodeid 4 = nobody
    assert wire.call(P.GETATTR, 18, 99, bytes(16)) == out_header(16, -errno.ENOENT, 18)


def test_forget_and_batch_forget_get_no_reply(wire):
    wire.start()
    wire.send(P.FORGET, 20, 2, struct.pack("<Q", 1))                       # fuse_forget_in: u64 nlookup
    wire.send(P.BATCH_FORGET, 21, 0, struct.pack("<II", 2, 0) + struct.pack("<QQQQ", 2, 1, 3, 1))
    assert wire.call(P.GETATTR, 22, 3, bytes(16))[:16] == out_header(120, 0, 22)  # the next reply is for 22


def test_open_read_release_of_a_miss_then_a_hit(wire):
    wire.start()
    # struct fuse_open_in: u32 flags, u32 open_flags; struct fuse_open_out: u64 fh, u32 open_flags, s32 backing_id
    got = wire.call(P.OPEN, 30, 2, struct.pack("<II", os.O_RDONLY, 0))
    assert got == out_header(32, 0, 30) + struct.pack("<QIi", 1, 0, 0)    # a miss: no keep_cache
    # struct fuse_read_in: u64 fh, u64 offset, u32 size, u32 read_flags, u64 lock_owner, u32 flags, u32 padding
    got = wire.call(P.READ, 31, 2, struct.pack("<QQIIQII", 1, 1, 3, 0, 0, 0, 0))
    assert got == out_header(16 + 3, 0, 31) + b"ell"
    got = wire.call(P.READ, 32, 2, struct.pack("<QQIIQII", 1, 0, 4096, 0, 0, 0, 0))
    assert got == out_header(16 + 5, 0, 32) + b"hello"                     # short only at EOF
    assert wire.call(P.READ, 33, 2, struct.pack("<QQIIQII", 1, 5, 4096, 0, 0, 0, 0)) == out_header(16, 0, 33)
    # struct fuse_release_in: u64 fh, u32 flags, u32 release_flags, u64 lock_owner
    assert wire.call(P.RELEASE, 34, 2, struct.pack("<QIIQ", 1, 0, 0, 0)) == out_header(16, 0, 34)
    assert wire.call(P.READ, 35, 2, struct.pack("<QQIIQII", 1, 0, 10, 0, 0, 0, 0)) == out_header(16, -errno.EBADF, 35)
    got = wire.call(P.OPEN, 36, 2, struct.pack("<II", os.O_RDONLY, 0))
    assert got == out_header(32, 0, 36) + struct.pack("<QIi", 2, P.FOPEN_KEEP_CACHE, 0)  # a RAM hit
    s = wire.fe.cache.stats()
    assert s["opens"] == 2 and s["hits"]["ram"] == 1 and s["misses"] == 1


def test_open_errors(wire):
    wire.start()
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC):
        assert wire.call(P.OPEN, 40, 2, struct.pack("<II", flags, 0)) == out_header(16, -errno.EROFS, 40)
    assert wire.call(P.OPEN, 41, 1, struct.pack("<II", 0, 0)) == out_header(16, -errno.EISDIR, 41)
    os.unlink(wire.src / "b.txt")  # gone from the source: ENOENT, no handle
    assert wire.call(P.OPEN, 42, 3, struct.pack("<II", 0, 0)) == out_header(16, -errno.ENOENT, 42)
    assert wire.fe._files == {}


def dirent(ino, off, dtype, name):
    # struct fuse_dirent: u64 ino, u64 off, u32 namelen, u32 type, char name[] padded to 8
    return struct.pack("<QQII", ino, off, len(name), dtype) + name + bytes(-len(name) % 8)


def test_opendir_readdir_readdirplus_releasedir(wire):
    wire.start()
    got = wire.call(P.OPENDIR, 50, 1, struct.pack("<II", os.O_RDONLY | os.O_DIRECTORY, 0))
    assert got == out_header(32, 0, 50) + struct.pack("<QIi", 0, P.FOPEN_CACHE_DIR | P.FOPEN_KEEP_CACHE, 0)
    assert wire.call(P.OPENDIR, 51, 2, bytes(8)) == out_header(16, -errno.ENOTDIR, 51)
    listing = dirent(1, 1, 4, b".") + dirent(1, 2, 4, b"..") + dirent(5, 3, 4, b"a") + dirent(3, 4, 8, b"b.txt")
    got = wire.call(P.READDIR, 52, 1, struct.pack("<QQIIQII", 0, 0, 4096, 0, 0, 0, 0))
    assert got == out_header(16 + len(listing), 0, 52) + listing
    # from offset 2, with room for exactly one 32-byte entry
    got = wire.call(P.READDIR, 53, 1, struct.pack("<QQIIQII", 0, 2, 39, 0, 0, 0, 0))
    assert got == out_header(16 + 32, 0, 53) + dirent(5, 3, 4, b"a")
    assert wire.call(P.READDIR, 54, 1, struct.pack("<QQIIQII", 0, 4, 4096, 0, 0, 0, 0)) == out_header(16, 0, 54)
    # READDIRPLUS: struct fuse_direntplus = fuse_entry_out + fuse_dirent; "." and ".." carry nodeid 0
    got = wire.call(P.READDIRPLUS, 55, 5, struct.pack("<QQIIQII", 0, 0, 4096, 0, 0, 0, 0))
    want = (entry_out(0, bytes(88), 0) + dirent(5, 1, 4, b".") + entry_out(0, bytes(88), 0) + dirent(1, 2, 4, b"..")
            + entry_out(2, attr(2, 0o100444, 5, 1)) + dirent(2, 3, 8, b"x.bin"))
    assert got == out_header(16 + len(want), 0, 55) + want
    assert wire.call(P.RELEASEDIR, 56, 1, struct.pack("<QIIQ", 0, 0, 0, 0)) == out_header(16, 0, 56)


def test_statfs(wire):
    wire.start()
    # struct fuse_kstatfs: u64 blocks bfree bavail files ffree; u32 bsize namelen frsize padding spare[6]
    want = struct.pack("<QQQQQIIII24x", 1, 0, 0, 2, 0, 4096, 255, 4096, 0)
    assert wire.call(P.STATFS, 60, 1) == out_header(16 + 80, 0, 60) + want


def test_getxattr_listxattr(wire):
    wire.start()
    ep = Daemon.endpoint.encode()
    name = b"user.shadefs.endpoint\x00"
    # struct fuse_getxattr_in: u32 size, u32 padding, then the name; size 0 asks for the length
    assert wire.call(P.GETXATTR, 70, 2, struct.pack("<II", 0, 0) + name) == out_header(24, 0, 70) + struct.pack("<II", len(ep), 0)
    assert wire.call(P.GETXATTR, 71, 1, struct.pack("<II", 256, 0) + name) == out_header(16 + len(ep), 0, 71) + ep
    assert wire.call(P.GETXATTR, 72, 1, struct.pack("<II", 4, 0) + name) == out_header(16, -errno.ERANGE, 72)
    assert wire.call(P.GETXATTR, 73, 1, struct.pack("<II", 256, 0) + b"user.other\x00") == out_header(16, -errno.ENODATA, 73)
    assert wire.call(P.LISTXATTR, 74, 1, struct.pack("<II", 0, 0)) == out_header(24, 0, 74) + struct.pack("<II", len(name), 0)
    assert wire.call(P.LISTXATTR, 75, 1, struct.pack("<II", 100, 0)) == out_header(16 + len(name), 0, 75) + name
    wire.fe.daemon = None  # before the control plane exists: no attribute
    assert wire.call(P.GETXATTR, 76, 1, struct.pack("<II", 256, 0) + name) == out_header(16, -errno.ENODATA, 76)
    assert wire.call(P.LISTXATTR, 77, 1, struct.pack("<II", 100, 0)) == out_header(16, 0, 77)


def test_access_flush_enosys_writes_erofs_unknown_enosys_destroy(wire):
    wire.start()
    assert wire.call(P.ACCESS, 80, 1, struct.pack("<II", 4, 0)) == out_header(16, -errno.ENOSYS, 80)
    assert wire.call(P.FLUSH, 81, 2, struct.pack("<QIIQ", 1, 0, 0, 0)) == out_header(16, -errno.ENOSYS, 81)
    for op in (P.MKDIR, P.UNLINK, P.SETATTR, P.CREATE, P.WRITE, P.SETXATTR, P.RENAME2):
        assert wire.call(op, 82, 1, bytes(16)) == out_header(16, -errno.EROFS, 82)
    for op in (P.GETLK, P.LSEEK, P.STATX, 4095):
        assert wire.call(op, 83, 1, bytes(16)) == out_header(16, -errno.ENOSYS, 83)
    assert wire.call(P.INIT, 84, 0, bytes(64)) == out_header(16, -errno.EPROTO, 84)  # a second INIT
    assert wire.call(P.DESTROY, 85, 0) == out_header(16, 0, 85)
    wire.thread.join(5)
    assert not wire.thread.is_alive() and wire.fe._stop.is_set()


def test_ioctl_is_answered_enotty_and_by_the_compiled_loop_without_python(wire):
    # FUSE_IOCTL: one per isatty() of an open file (Python's buffered open() makes one); no reply stops the
    # kernel sending them, so each is answered at the least cost: ENOTTY (what the kernel would turn an
    # ENOSYS into), by the compiled loop itself
    from shadefs.fuse import _fastloop
    calls = []
    dispatch = wire.fe._dispatch
    wire.fe._dispatch = lambda *a: (calls.append(a[2]), dispatch(*a))
    before = _fastloop.ioctls()
    wire.start()
    # struct fuse_ioctl_in: u64 fh; u32 flags cmd; u64 arg; u32 in_size out_size (TCGETS, 60 bytes out)
    body = struct.pack("<QIIQII", 1, 0, 0x5401, 0x7FFC0000, 0, 60)
    for u in (86, 87):
        assert wire.call(P.IOCTL, u, 2, body) == out_header(16, -errno.ENOTTY, u)
    assert wire.call(P.GETATTR, 88, 2, bytes(16))[:16] == out_header(120, 0, 88)  # the loop goes on
    if wire.fe.compiled_loop:
        assert (_fastloop.ioctls() - before, wire.fe.ioctls, calls) == (2, 0, [P.GETATTR])
    else:
        assert (_fastloop.ioctls() - before, wire.fe.ioctls, calls) == (0, 2, [P.IOCTL, P.IOCTL, P.GETATTR])


def test_interrupt_answers_a_waiting_miss_eintr_and_drops_the_late_open(wire, monkeypatch):
    gate = threading.Event()
    backend = wire.fe.cache.backend
    real_read = backend.read

    def held_read(path, size):
        assert gate.wait(10)
        return real_read(path, size)

    monkeypatch.setattr(backend, "read", held_read)
    wire.fe.reader_misses = False   # the miss goes to a worker, as a network source's does (one reader here)
    wire.start()
    wire.send(P.OPEN, 90, 2, struct.pack("<II", 0, 0))              # a miss: waits on the backend
    # a hit and metadata are answered while the miss waits
    assert wire.call(P.GETATTR, 91, 3, bytes(16))[:16] == out_header(120, 0, 91)
    wire.send(P.INTERRUPT, 93, 0, struct.pack("<Q", 90))            # struct fuse_interrupt_in: u64 unique
    assert wire.recv() == out_header(16, -errno.EINTR, 90)
    gate.set()
    # the worker's late reply is dropped (nothing arrives for 90) and its handle released
    assert wire.call(P.GETATTR, 94, 3, bytes(16))[:16] == out_header(120, 0, 94)
    for _ in range(100):
        if not wire.fe._pending and not wire.fe._files:
            break
        threading.Event().wait(0.02)
    assert wire.fe._files == {} and wire.fe._pending == {} and wire.fe.interrupted == 1


def test_reply_check_logs_a_malformed_reply(wire, caplog):
    fd = wire.server.fileno()
    wire.fe._send(fd, 7, P.GETATTR, 0, (bytes(100),))              # an attr_out is 104 bytes
    assert "FUSE reply check failed" in caplog.text and "Traceback" in caplog.text
    wire.recv()


def test_the_compiled_loop_is_built_and_serves_open_and_release(wire):
    # pip install builds shadefs.fuse._fastloop (setup.py); it answers RELEASE without the GIL and drops
    # the released handles in one batch when no request follows for ~2 ms
    from shadefs.fuse import _fastloop
    wire.fe.compiled_loop = True
    wire.start()
    assert wire.call(P.OPEN, 70, 2, struct.pack("<II", os.O_RDONLY, 0)) == out_header(32, 0, 70) + \
        struct.pack("<QIi", 1, 0, 0)                                                   # a miss
    for i in range(3):                                                                 # RAM hits, replied in C
        got = wire.call(P.OPEN, 71 + i, 2, struct.pack("<II", os.O_RDONLY, 0))
        assert got == out_header(32, 0, 71 + i) + struct.pack("<QIi", 2 + i, P.FOPEN_KEEP_CACHE, 0)
    assert sorted(wire.fe._files) == [1, 2, 3, 4]
    released = _fastloop.released()
    for fh in (1, 2, 3, 4):
        wire.send(P.RELEASE, 80 + fh, 2, struct.pack("<QIIQ", fh, 0, 0, 0))
    assert sorted(wire.recv() for _ in range(4)) == [out_header(16, 0, 80 + fh) for fh in (1, 2, 3, 4)]
    assert wait_for(lambda: wire.fe._files == {}, timeout=10)
    assert _fastloop.released() - released == 4
    # an unknown node id, a directory, a write: errors replied by Python, no handle
    assert wire.call(P.OPEN, 90, 999, struct.pack("<II", 0, 0)) == out_header(16, -errno.ENOENT, 90)
    assert wire.call(P.OPEN, 91, 1, struct.pack("<II", 0, 0)) == out_header(16, -errno.EISDIR, 91)
    assert wire.call(P.OPEN, 92, 2, struct.pack("<II", os.O_WRONLY, 0)) == out_header(16, -errno.EROFS, 92)
    s = wire.fe.cache.stats()
    assert s["opens"] == 4 and s["hits"]["ram"] == 3 and s["misses"] == 1 and wire.fe._files == {}


def test_ram_hits_open_read_and_release_are_answered_by_the_compiled_loop_and_counted_by_the_cache(wire):
    # a file's first RAM hit (served by the cache) publishes it to the front end's table of residents; its
    # later OPEN, READ and RELEASE are answered in C (file handles 1 << 62 | slot), logged, and counted by
    # the cache's next critical section (the stats)
    if not wire.fe.compiled_loop:
        pytest.skip("the compiled loop's own path")
    wire.fe._attach_residents()
    res = wire.fe.residents
    assert res is not None
    calls = []
    dispatch, open_compiled = wire.fe._dispatch, wire.fe._open_compiled
    wire.fe._dispatch = lambda *a: (calls.append(a[2]), dispatch(*a))[1]
    wire.fe._open_compiled = lambda *a: (calls.append(P.OPEN), open_compiled(*a))[1]
    wire.start()
    c_fh = 1 << 62
    assert wire.call(P.OPEN, 30, 2, struct.pack("<II", os.O_RDONLY, 0)) == out_header(32, 0, 30) + \
        struct.pack("<QIi", 1, 0, 0)                                               # a miss
    assert wire.call(P.RELEASE, 31, 2, struct.pack("<QIIQ", 1, 0, 0, 0)) == out_header(16, 0, 31)
    assert wire.call(P.OPEN, 32, 2, struct.pack("<II", os.O_RDONLY, 0)) == out_header(32, 0, 32) + \
        struct.pack("<QIi", 2, P.FOPEN_KEEP_CACHE, 0)                              # a RAM hit: published
    for i in range(2):                                                             # answered in C
        assert wire.call(P.OPEN, 33 + i, 2, struct.pack("<II", os.O_RDONLY, 0)) == out_header(32, 0, 33 + i) + \
            struct.pack("<QIi", c_fh | i, P.FOPEN_KEEP_CACHE, 0)
    assert calls == [P.OPEN, P.OPEN]
    got = wire.call(P.READ, 40, 2, struct.pack("<QQIIQII", c_fh, 1, 3, 0, 0, 0, 0))
    assert got == out_header(16 + 3, 0, 40) + b"ell"
    got = wire.call(P.READ, 41, 2, struct.pack("<QQIIQII", c_fh | 1, 0, 4096, 0, 0, 0, 0))
    assert got == out_header(16 + 5, 0, 41) + b"hello"                             # short only at EOF
    assert wire.call(P.READ, 42, 2, struct.pack("<QQIIQII", c_fh, 5, 4096, 0, 0, 0, 0)) == out_header(16, 0, 42)
    assert wire.call(P.READ, 43, 2, struct.pack("<QQIIQII", c_fh | 7, 0, 10, 0, 0, 0, 0)) == \
        out_header(16, -errno.EBADF, 43)                                           # no such open
    for fh in (c_fh, c_fh | 1, 2):
        assert wire.call(P.RELEASE, 50, 2, struct.pack("<QIIQ", fh, 0, 0, 0)) == out_header(16, 0, 50)
    assert calls == [P.OPEN, P.OPEN]
    assert res.counters() == {"opens": 2, "reads": 3, "log_full": 0, "published": 1, "held": 0}
    s = wire.fe.cache.stats()                                                      # applies the log first
    assert (s["opens"], s["hits"]["ram"], s["misses"], s["byte_hit_ratio"]) == (4, 3, 1, 0.75)
    assert res.pending() == 0
    assert wait_for(lambda: wire.fe._files == {}, timeout=10)
    # write flags, a directory, an unknown node: Python's replies, as before
    assert wire.call(P.OPEN, 60, 2, struct.pack("<II", os.O_WRONLY, 0)) == out_header(16, -errno.EROFS, 60)
    assert wire.call(P.OPEN, 61, 1, struct.pack("<II", 0, 0)) == out_header(16, -errno.EISDIR, 61)
    assert wire.call(P.OPEN, 62, 999, struct.pack("<II", 0, 0)) == out_header(16, -errno.ENOENT, 62)
    assert wire.fe.cache.stats()["opens"] == 4


def test_page_probe_writes_notify_retrieve_and_reads_the_kernels_notify_reply(wire):
    """``pages_held``: one FUSE_NOTIFY_RETRIEVE of 1 byte at the first page (a file of one page), as fuse.h
    lays it out; the kernel's NOTIFY_REPLY (a request carrying the bytes it found, never answered) says
    whether it holds it."""
    wire.start()
    wire.fe.fd = wire.server.fileno()
    for found, want in ((b"h", True), (b"", False)):
        got = []
        t = threading.Thread(target=lambda: got.append(wire.fe.pages_held(0)))
        t.start()
        notify = wire.recv()
        # fuse_out_header {len, error = FUSE_NOTIFY_RETRIEVE (5), unique 0} + struct fuse_notify_retrieve_out
        # {u64 notify_unique, u64 nodeid, u64 offset, u32 size, u32 padding}
        unique = struct.unpack_from("<Q", notify, 16)[0]
        assert notify == out_header(48, 5, 0) + struct.pack("<QQQII", unique, 2, 0, 1, 0)
        # struct fuse_notify_retrieve_in {u64 dummy1, u64 offset, u32 size, u32 dummy2, u64 dummy3, u64 dummy4}
        wire.send(P.NOTIFY_REPLY, unique, 2, struct.pack("<QQIIQQ", 0, 0, len(found), 0, 0, 0) + found)
        t.join(5)
        assert got == [want]
    assert (wire.fe.probes, wire.fe.probes_held, wire.fe._probes) == (2, 1, {})
    assert wire.call(P.GETATTR, 60, 2, bytes(16))[:16] == out_header(120, 0, 60)  # NOTIFY_REPLY got no reply


def test_open_now_covers_an_open_from_its_arrival_to_its_release(wire):
    wire.start()
    assert not wire.fe.open_now(0)
    got = wire.call(P.OPEN, 70, 2, struct.pack("<II", os.O_RDONLY, 0))
    fh = struct.unpack_from("<Q", got, 16)[0]
    assert wire.fe.open_now(0) and not wire.fe.open_now(1)
    assert wire.call(P.RELEASE, 71, 2, struct.pack("<QIIQ", fh, 0, 0, 0)) == out_header(16, 0, 71)
    wait_for(lambda: not wire.fe.open_now(0), what="the release")
    assert wire.fe._opening == {}

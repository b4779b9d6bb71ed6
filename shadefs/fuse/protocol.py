"""The FUSE kernel protocol (``linux/fuse.h``, protocol 7.x): constants and the byte layouts a read-only
server reads and writes on ``/dev/fuse``.

Every request starts with ``struct fuse_in_header`` (40 bytes), every reply with ``struct
fuse_out_header`` (16 bytes, ``len`` = the whole reply in bytes, ``error`` = 0 or a negative errno).
All integers are native-endian (the kernel and the server share the machine). The header installed here
(``/usr/include/linux/fuse.h``) stops at 7.38; the passthrough parts (7.40: ``FUSE_PASSTHROUGH``,
``FOPEN_PASSTHROUGH``, ``fuse_open_out.backing_id``, ``fuse_init_out.max_stack_depth``, the
``FUSE_DEV_IOC_BACKING_OPEN/CLOSE`` ioctls) are spelled out here from the kernel's uapi header.

Encoders return ``bytes``; decoders take a buffer (``bytes``/``bytearray``/``memoryview``) and an offset.
Nothing here does I/O: tests check every layout against hand-written byte vectors
(tests/unit/test_fuse_protocol.py).
"""
from __future__ import annotations

import struct
from typing import NamedTuple

# -- versions and ids --------------------------------------------------------------------------------
KERNEL_VERSION = 7
KERNEL_MINOR_VERSION = 41     # what this server speaks (passthrough is 7.40; we answer min(kernel's, this))
ROOT_ID = 1                   # FUSE_ROOT_ID
MIN_READ_BUFFER = 8192        # FUSE_MIN_READ_BUFFER

# -- opcodes -------------------------------------------------------------------------------------------
LOOKUP, FORGET, GETATTR, SETATTR, READLINK, SYMLINK = 1, 2, 3, 4, 5, 6
MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK, OPEN, READ, WRITE, STATFS, RELEASE = 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18
FSYNC, SETXATTR, GETXATTR, LISTXATTR, REMOVEXATTR, FLUSH, INIT = 20, 21, 22, 23, 24, 25, 26
OPENDIR, READDIR, RELEASEDIR, FSYNCDIR, GETLK, SETLK, SETLKW, ACCESS, CREATE, INTERRUPT = \
    27, 28, 29, 30, 31, 32, 33, 34, 35, 36
BMAP, DESTROY, IOCTL, POLL, NOTIFY_REPLY, BATCH_FORGET, FALLOCATE, READDIRPLUS = 37, 38, 39, 40, 41, 42, 43, 44
RENAME2, LSEEK, COPY_FILE_RANGE, SETUPMAPPING, REMOVEMAPPING, SYNCFS, TMPFILE, STATX = \
    45, 46, 47, 48, 49, 50, 51, 52

OPCODE_NAMES = {v: k for k, v in dict(globals()).items() if k.isupper() and isinstance(v, int) and 1 <= v <= 52
                and k not in ("KERNEL_VERSION", "KERNEL_MINOR_VERSION", "ROOT_ID")}
#: opcodes that modify the filesystem: answered EROFS (the kernel stops most of them on a ``ro`` mount)
WRITE_OPS = frozenset({SETATTR, SYMLINK, MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK, WRITE, SETXATTR,
                       REMOVEXATTR, CREATE, FALLOCATE, RENAME2, COPY_FILE_RANGE, TMPFILE})
#: opcodes the kernel sends without waiting for (and never accepting) a reply
NO_REPLY = frozenset({FORGET, BATCH_FORGET})

# -- INIT flags (fuse_init_in/out.flags; bits 32.. go to flags2) --------------------------------------
ASYNC_READ = 1 << 0
ATOMIC_O_TRUNC = 1 << 3
EXPORT_SUPPORT = 1 << 4
BIG_WRITES = 1 << 5
AUTO_INVAL_DATA = 1 << 12
DO_READDIRPLUS = 1 << 13
READDIRPLUS_AUTO = 1 << 14
ASYNC_DIO = 1 << 15
WRITEBACK_CACHE = 1 << 16
NO_OPEN_SUPPORT = 1 << 17
PARALLEL_DIROPS = 1 << 18
ABORT_ERROR = 1 << 21
MAX_PAGES = 1 << 22
CACHE_SYMLINKS = 1 << 23
NO_OPENDIR_SUPPORT = 1 << 24
INIT_EXT = 1 << 30
PASSTHROUGH = 1 << 37          # flags2 bit 5 (protocol 7.40)

INIT_FLAG_NAMES = {ASYNC_READ: "async_read", DO_READDIRPLUS: "readdirplus", READDIRPLUS_AUTO: "readdirplus_auto",
                   PARALLEL_DIROPS: "parallel_dirops", MAX_PAGES: "max_pages", PASSTHROUGH: "passthrough",
                   INIT_EXT: "init_ext"}

# -- FOPEN_* (fuse_open_out.open_flags) ---------------------------------------------------------------
FOPEN_DIRECT_IO = 1 << 0
FOPEN_KEEP_CACHE = 1 << 1
FOPEN_NONSEEKABLE = 1 << 2
FOPEN_CACHE_DIR = 1 << 3
FOPEN_STREAM = 1 << 4
FOPEN_NOFLUSH = 1 << 5
FOPEN_PASSTHROUGH = 1 << 7

GETATTR_FH = 1 << 0

# -- ioctls on /dev/fuse ---------------------------------------------------------------------------------
_IOC_WRITE, _IOC_READ = 1, 2


def _ioc(direction: int, nr: int, size: int, magic: int = 229) -> int:
    return (direction << 30) | (size << 16) | (magic << 8) | nr


DEV_IOC_CLONE = _ioc(_IOC_READ, 0, 4)             # _IOR(229, 0, uint32_t)       = 0x8004e500
DEV_IOC_BACKING_OPEN = _ioc(_IOC_WRITE, 1, 16)    # _IOW(229, 1, fuse_backing_map) = 0x4010e501
DEV_IOC_BACKING_CLOSE = _ioc(_IOC_WRITE, 2, 4)    # _IOW(229, 2, uint32_t)       = 0x4004e502
BACKING_MAP = struct.Struct("=iIQ")               # struct fuse_backing_map {int32 fd; uint32 flags; uint64 padding}

# -- layouts ---------------------------------------------------------------------------------------------
IN_HEADER = struct.Struct("=IIQQIIIHH")           # len opcode unique nodeid uid gid pid total_extlen padding (40)
OUT_HEADER = struct.Struct("=IiQ")                # len error unique (16)
INIT_IN = struct.Struct("=IIIII44x")              # major minor max_readahead flags flags2 unused[11] (64)
INIT_IN_COMPAT = struct.Struct("=IIII")           # before 7.36: 16 bytes
INIT_OUT = struct.Struct("=IIIIHHIIHHII24x")      # ... max_pages map_alignment flags2 max_stack_depth unused[6] (64)
ATTR = struct.Struct("=QQQQQQIIIIIIIIII")         # struct fuse_attr (88)
ENTRY_OUT = struct.Struct("=QQQQII")              # nodeid generation entry_valid attr_valid (+nsec x2) (40) + attr
ATTR_OUT = struct.Struct("=QII")                  # attr_valid attr_valid_nsec dummy (16) + attr
GETATTR_IN = struct.Struct("=IIQ")                # getattr_flags dummy fh (16)
OPEN_IN = struct.Struct("=II")                    # flags open_flags (8)
OPEN_OUT = struct.Struct("=QIi")                  # fh open_flags backing_id (16)
READ_IN = struct.Struct("=QQIIQII")               # fh offset size read_flags lock_owner flags padding (40)
RELEASE_IN = struct.Struct("=QIIQ")               # fh flags release_flags lock_owner (24)
FLUSH_IN = struct.Struct("=QIIQ")                 # fh unused padding lock_owner (24)
FORGET_IN = struct.Struct("=Q")                   # nlookup (8)
BATCH_FORGET_IN = struct.Struct("=II")            # count dummy (8), then count x fuse_forget_one
FORGET_ONE = struct.Struct("=QQ")                 # nodeid nlookup (16)
INTERRUPT_IN = struct.Struct("=Q")                # unique (8)
GETXATTR_IN = struct.Struct("=II")                # size padding (8), then the name (NUL-terminated)
GETXATTR_OUT = struct.Struct("=II")               # size padding (8)
ACCESS_IN = struct.Struct("=II")                  # mask padding (8)
KSTATFS = struct.Struct("=QQQQQIIII24x")          # blocks bfree bavail files ffree bsize namelen frsize padding spare[6] (80)
DIRENT = struct.Struct("=QQII")                   # ino off namelen type (24), then the name, padded to 8
# notifications: a write whose fuse_out_header has unique 0 and the notify code in its error field
NOTIFY_RETRIEVE = 5                               # enum fuse_notify_code FUSE_NOTIFY_RETRIEVE (protocol 7.15)
NOTIFY_RETRIEVE_OUT = struct.Struct("=QQQII")     # notify_unique nodeid offset size padding (32)
# the kernel's answer: a FUSE_NOTIFY_REPLY request (no reply expected) whose unique is the notify_unique,
# its body this struct (the size of fuse_write_in), then the bytes of the pages it found
NOTIFY_RETRIEVE_IN = struct.Struct("=QQIIQQ")     # dummy1 offset size dummy2 dummy3 dummy4 (40)

assert (IN_HEADER.size, OUT_HEADER.size, INIT_IN.size, INIT_OUT.size, ATTR.size, ENTRY_OUT.size + ATTR.size,
        ATTR_OUT.size + ATTR.size, OPEN_OUT.size, READ_IN.size, KSTATFS.size, DIRENT.size,
        NOTIFY_RETRIEVE_OUT.size, NOTIFY_RETRIEVE_IN.size) == \
    (40, 16, 64, 64, 88, 128, 104, 16, 40, 80, 24, 32, 40)

ENTRY_OUT_SIZE = ENTRY_OUT.size + ATTR.size       # 128
ATTR_OUT_SIZE = ATTR_OUT.size + ATTR.size         # 104
DIRENTPLUS_BASE = ENTRY_OUT_SIZE + DIRENT.size    # 152


class InHeader(NamedTuple):
    len: int
    opcode: int
    unique: int
    nodeid: int
    uid: int
    gid: int
    pid: int
    total_extlen: int


def decode_in_header(buf, offset: int = 0) -> InHeader:
    """``struct fuse_in_header`` at ``offset`` of ``buf``."""
    return InHeader(*IN_HEADER.unpack_from(buf, offset)[:8])


def out_header(body_len: int, error: int, unique: int) -> bytes:
    """``struct fuse_out_header`` for a reply whose body is ``body_len`` bytes; ``error`` is a positive
    errno (0 = success) and is sent negated, as the kernel expects."""
    return OUT_HEADER.pack(OUT_HEADER.size + body_len, -error, unique)


def decode_cstring(buf, offset: int, end: int) -> bytes:
    """A NUL-terminated name in ``buf[offset:end]`` (the NUL is dropped; a missing NUL takes all)."""
    raw = bytes(buf[offset:end])
    nul = raw.find(b"\x00")
    return raw if nul < 0 else raw[:nul]


class InitIn(NamedTuple):
    major: int
    minor: int
    max_readahead: int
    flags: int          # flags | flags2 << 32 when the kernel sent FUSE_INIT_EXT


def decode_init_in(buf, offset: int, length: int) -> InitIn:
    major, minor, ra, flags = INIT_IN_COMPAT.unpack_from(buf, offset)
    if length >= INIT_IN.size and flags & INIT_EXT:
        flags |= INIT_IN.unpack_from(buf, offset)[4] << 32
    return InitIn(major, minor, ra, flags)


def encode_init_out(minor: int, max_readahead: int, flags: int, max_background: int, congestion_threshold: int,
                    max_write: int, time_gran: int, max_pages: int, max_stack_depth: int = 0) -> bytes:
    """``struct fuse_init_out`` (64 bytes); ``flags`` bits 32.. go to ``flags2``."""
    return INIT_OUT.pack(KERNEL_VERSION, minor, max_readahead, flags & 0xFFFFFFFF, max_background,
                         congestion_threshold, max_write, time_gran, max_pages, 0, flags >> 32, max_stack_depth)


def encode_attr(ino: int, mode: int, size: int, mtime_ns: int, uid: int, gid: int, nlink: int,
                blksize: int = 4096) -> bytes:
    """``struct fuse_attr`` (88 bytes): atime = mtime = ctime = ``mtime_ns``; 512-byte blocks."""
    sec, nsec = divmod(mtime_ns, 1_000_000_000)
    return ATTR.pack(ino, size, (size + 511) // 512, sec, sec, sec, nsec, nsec, nsec, mode, nlink, uid, gid,
                     0, blksize, 0)


def encode_entry_out(nodeid: int, attr: bytes, entry_valid_s: int, attr_valid_s: int) -> bytes:
    """``struct fuse_entry_out`` (128 bytes). ``nodeid`` 0 with ``attr`` of zeros: a cached negative entry."""
    return ENTRY_OUT.pack(nodeid, 0, entry_valid_s, attr_valid_s, 0, 0) + attr


def encode_attr_out(attr: bytes, attr_valid_s: int) -> bytes:
    """``struct fuse_attr_out`` (104 bytes)."""
    return ATTR_OUT.pack(attr_valid_s, 0, 0) + attr


def encode_open_out(fh: int, open_flags: int, backing_id: int = 0) -> bytes:
    """``struct fuse_open_out`` (16 bytes)."""
    return OPEN_OUT.pack(fh, open_flags, backing_id)


def dirent_size(namelen: int, plus: bool = False) -> int:
    """Bytes one entry takes in a READDIR (``plus``: READDIRPLUS) reply: header + name padded to 8."""
    return (DIRENTPLUS_BASE if plus else DIRENT.size) + ((namelen + 7) & ~7)


def encode_dirent(ino: int, next_off: int, dtype: int, name: bytes) -> bytes:
    """``struct fuse_dirent`` + name + zero padding to a multiple of 8 bytes. ``next_off`` is the offset
    the kernel passes back to continue after this entry; ``dtype`` is ``st_mode >> 12``."""
    pad = (-len(name)) % 8
    return DIRENT.pack(ino, next_off, len(name), dtype) + name + b"\x00" * pad


def encode_direntplus(entry_out: bytes, ino: int, next_off: int, dtype: int, name: bytes) -> bytes:
    """``struct fuse_direntplus``: an entry_out (128 bytes) followed by the dirent."""
    return entry_out + encode_dirent(ino, next_off, dtype, name)


def encode_statfs(blocks: int, bfree: int, bavail: int, files: int, ffree: int, bsize: int, namelen: int,
                  frsize: int) -> bytes:
    """``struct fuse_statfs_out`` (80 bytes)."""
    return KSTATFS.pack(blocks, bfree, bavail, files, ffree, bsize, namelen, frsize, 0)


def encode_notify_retrieve(notify_unique: int, nodeid: int, offset: int, size: int) -> bytes:
    """A whole ``FUSE_NOTIFY_RETRIEVE`` write: ask the kernel for the cached bytes of node ``nodeid`` at
    ``offset`` (bytes), at most ``size`` (the kernel caps it at the connection's ``max_write``). It answers
    with a ``NOTIFY_REPLY`` request of unique ``notify_unique`` carrying the bytes of the pages it holds
    from ``offset`` on, up to the first page it does not hold (0 bytes when it holds none of them)."""
    return out_header(NOTIFY_RETRIEVE_OUT.size, -NOTIFY_RETRIEVE, 0) + \
        NOTIFY_RETRIEVE_OUT.pack(notify_unique, nodeid, offset, size, 0)


def encode_getxattr_out(size: int) -> bytes:
    """``struct fuse_getxattr_out``: the value's size, for a GETXATTR/LISTXATTR asked with size 0."""
    return GETXATTR_OUT.pack(size, 0)


def expected_reply_len(opcode: int, error: int, body_len: int, asked: int = 0) -> bool:
    """Whether a reply of ``body_len`` bytes is well-formed for ``opcode`` (the reply-length check).

    ``asked`` is the size the request asked for (READ, READDIR(PLUS), GETXATTR, LISTXATTR).
    An error reply has no body.
    """
    if error:
        return body_len == 0
    fixed = {INIT: INIT_OUT.size, LOOKUP: ENTRY_OUT_SIZE, GETATTR: ATTR_OUT_SIZE, OPEN: OPEN_OUT.size,
             OPENDIR: OPEN_OUT.size, STATFS: KSTATFS.size, RELEASE: 0, RELEASEDIR: 0, FLUSH: 0, ACCESS: 0,
             DESTROY: 0, INTERRUPT: 0}
    if opcode in fixed:
        return body_len == fixed[opcode]
    if opcode in (READ, READDIR, READDIRPLUS):
        return body_len <= asked
    if opcode in (GETXATTR, LISTXATTR):
        return body_len == GETXATTR_OUT.size if asked == 0 else body_len <= asked
    return False

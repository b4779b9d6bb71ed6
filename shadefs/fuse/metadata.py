"""The kernel front end's metadata requests: answered from the namespace snapshot on the reader thread
(a reused snapshot's record is compared with the source on a worker at its first LOOKUP)."""
from __future__ import annotations

import errno
import logging
from typing import Optional

from . import protocol as P
from .ops import ENDPOINT_XATTR, endpoint_of, listdir_slice, statfs_values

log = logging.getLogger("shadefs.fuse")

TIMEOUT_S = 3600          # entry, attribute and negative-entry cache timeouts (the snapshot is immutable)


class MetadataOps:
    """LOOKUP, GETATTR, STATFS, xattrs, OPENDIR and READDIR(PLUS), answered from the snapshot (mixed into
    :class:`~shadefs.fuse.kernel.KernelFrontend`)."""

    def _lookup(self, fd, unique, nodeid, buf, n) -> None:
        parent = self.node_of(nodeid)
        name = P.decode_cstring(buf, P.IN_HEADER.size, n).decode("utf-8", "surrogateescape")
        child = self.ns.child(parent, name) if self.ns.is_dir(parent) else None
        if child is None:  # a negative entry, cached by the kernel for TIMEOUT_S (libfuse negative_timeout)
            body = P.encode_entry_out(0, bytes(P.ATTR.size), TIMEOUT_S, 0)
        elif self._recheck is not None and child < self._num_files and self._recheck_needed(child):
            # a reused snapshot's record: compared with the source (a stat) on a worker before the kernel
            # caches its size
            self._defer(fd, unique, self._lookup_checked, child)
            return
        else:
            body = P.encode_entry_out(self.nodeid_of(child), self._attr(child), TIMEOUT_S, TIMEOUT_S)
        self._send(fd, unique, P.LOOKUP, 0, (body,))

    def _lookup_checked(self, fd: int, unique: int, child: int) -> None:
        """Worker: the LOOKUP of a file whose snapshot record was not compared with the source yet."""
        try:
            self._recheck(child)
        except Exception as e:  # gone or unreachable: the open reports it; the entry is the snapshot's
            log.info("lookup %s: %s", self.ns.path(child), e)
        body = P.encode_entry_out(self.nodeid_of(child), self._attr(child), TIMEOUT_S, TIMEOUT_S)
        if self._finish(unique):
            self._send(fd, unique, P.LOOKUP, 0, (body,))

    def _getattr(self, fd, unique, nodeid, buf, n) -> None:
        node = self.node_of(nodeid)
        self._send(fd, unique, P.GETATTR, 0, (P.encode_attr_out(self._attr(node), TIMEOUT_S),))

    def _statfs(self, fd, unique, nodeid, buf, n) -> None:
        v = statfs_values(self.ns)
        body = P.encode_statfs(v["f_blocks"], v["f_bfree"], v["f_bavail"], v["f_files"], v["f_ffree"],
                               v["f_bsize"], v["f_namemax"], v["f_frsize"])
        self._send(fd, unique, P.STATFS, 0, (body,))

    def _xattr_reply(self, fd, unique, opcode, value: Optional[bytes], asked: int) -> None:
        if value is None:
            self._send(fd, unique, opcode, errno.ENODATA, ())
        elif asked == 0:
            self._send(fd, unique, opcode, 0, (P.encode_getxattr_out(len(value)),), asked)
        elif asked < len(value):
            self._send(fd, unique, opcode, errno.ERANGE, ())
        else:
            self._send(fd, unique, opcode, 0, (value,), asked)

    def _getxattr(self, fd, unique, nodeid, buf, n) -> None:
        self.node_of(nodeid)
        asked, _ = P.GETXATTR_IN.unpack_from(buf, P.IN_HEADER.size)
        name = P.decode_cstring(buf, P.IN_HEADER.size + P.GETXATTR_IN.size, n).decode("utf-8", "surrogateescape")
        endpoint = endpoint_of(self.daemon)
        value = endpoint.encode("utf-8") if name == ENDPOINT_XATTR and endpoint else None
        self._xattr_reply(fd, unique, P.GETXATTR, value, asked)

    def _listxattr(self, fd, unique, nodeid, buf, n) -> None:
        self.node_of(nodeid)
        asked, _ = P.GETXATTR_IN.unpack_from(buf, P.IN_HEADER.size)
        value = (ENDPOINT_XATTR.encode() + b"\x00") if endpoint_of(self.daemon) else b""
        self._xattr_reply(fd, unique, P.LISTXATTR, value, asked)

    def _opendir(self, fd, unique, nodeid, buf, n) -> None:
        node = self.node_of(nodeid)
        if not self.ns.is_dir(node):
            self._send(fd, unique, P.OPENDIR, errno.ENOTDIR, ())
            return
        # the snapshot is immutable: let the kernel cache the listing in its page cache
        self._send(fd, unique, P.OPENDIR, 0, (P.encode_open_out(0, P.FOPEN_CACHE_DIR | P.FOPEN_KEEP_CACHE),))

    def _listing(self, node: int, start: int, count: int) -> list:
        """Entries ``[start, start + count)`` of directory ``node``'s listing (``.``, ``..``, then the
        snapshot's children in name order) as ``(name bytes, node, d_type)``: built from the snapshot for
        each READDIR, never kept (a listing of a 1M-entry directory kept between READDIRs took ~139 MiB)."""
        nf = self._num_files
        out = []
        if start < 2:
            out = [(b".", node, 4), (b"..", self.ns.parent(node), 4)][start:start + count]
        first = max(0, start - 2)
        stop = start + count - 2
        if stop > first:
            out += [(name.encode("utf-8", "surrogateescape"), child, 4 if child >= nf else 8)
                    for name, child in listdir_slice(self.ns, node, first, stop)]
        return out

    def _readdir_common(self, fd, unique, nodeid, buf, opcode: int, plus: bool) -> None:
        node = self.node_of(nodeid)
        if not self.ns.is_dir(node):
            self._send(fd, unique, opcode, errno.ENOTDIR, ())
            return
        _, offset, size, _, _, _, _ = P.READ_IN.unpack_from(buf, P.IN_HEADER.size)
        # at most this many entries fit in the reply (each takes at least a header and 8 bytes of name)
        entries = self._listing(node, offset, size // P.dirent_size(1, plus) + 1)
        out, used = [], 0
        for i, (name, child, dtype) in enumerate(entries, offset):
            need = P.dirent_size(len(name), plus)
            if used + need > size:
                break
            ino = self.nodeid_of(child)
            if plus:
                if i < 2 or (self._recheck is not None and child < self._num_files and self._recheck_needed(child)):
                    # "." and "..": no entry (the kernel does not link them); a file whose reused snapshot
                    # record is not checked yet: none either, so that its first LOOKUP checks it
                    eo = P.encode_entry_out(0, bytes(P.ATTR.size), 0, 0)
                else:
                    eo = P.encode_entry_out(ino, self._attr(child), TIMEOUT_S, TIMEOUT_S)
                out.append(P.encode_direntplus(eo, ino, i + 1, dtype, name))
            else:
                out.append(P.encode_dirent(ino, i + 1, dtype, name))
            used += need
        self._send(fd, unique, opcode, 0, (b"".join(out),), size)

    def _readdir(self, fd, unique, nodeid, buf, n) -> None:
        self._readdir_common(fd, unique, nodeid, buf, P.READDIR, False)

    def _readdirplus(self, fd, unique, nodeid, buf, n) -> None:
        self._readdir_common(fd, unique, nodeid, buf, P.READDIRPLUS, True)

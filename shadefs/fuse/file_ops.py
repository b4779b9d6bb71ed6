"""The kernel front end's file requests: OPEN (a hit answered on the reader that read it, a miss on the
reader or on a worker, with passthrough where the kernel granted it), READ and RELEASE."""
from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import time
from typing import Optional, Tuple

from ..backends.timeout import on_deadline
from ..cache.handle import Handle, OpenTicket
from . import protocol as P
from .backing import BackingConflict
from .passthrough import SourceReads

log = logging.getLogger("shadefs.fuse")

_PID = struct.Struct("=I")
_PID_OFFSET = 32  # fuse_in_header: len, opcode (4 + 4), unique, nodeid (8 + 8), uid, gid (4 + 4), pid
# seconds an open that would go to the source file waits for the RELEASEs of earlier opens of the file that
# hold it in cached mode (the kernel sends RELEASE after close() returns, and the compiled loop applies
# RELEASEs in batches within ~2 ms): a reopen right after a close then still gets the source file; an open
# that is really still open past it makes the new open join its cached mode
SOURCE_RELEASE_WAIT_S = 0.02
# misses served on a reader thread that take longer than this on average (a moving average over about the
# last 32: a miss preempted for a few ms on a busy machine does not make the source slow; with one reader
# thread, the default, every other request waits while a miss holds it)...
READER_MISS_MAX_S = 0.001
# ...sends the misses to the workers for this long (then one is tried on a reader again: the average starts
# from READER_MISS_MAX_S, so one more slow miss sends them back, one fast one keeps them on the reader)
READER_MISS_BACKOFF_S = 5.0


class FileOps:
    """OPEN, READ and RELEASE of files (mixed into :class:`~shadefs.fuse.kernel.KernelFrontend`): the
    cache decides each open (``open_nowait``: a hit answered on the reader, a ticket served on the reader or
    a worker), and :meth:`_open_handle` turns its handle into a file handle and an io mode."""

    def _open(self, fd, unique, nodeid, buf, n) -> None:
        flags, _ = P.OPEN_IN.unpack_from(buf, P.IN_HEADER.size)
        pid = _PID.unpack_from(buf, _PID_OFFSET)[0]  # the opener (fuse_in_header.pid): plans follow its job's opens
        reply = self._open_request(fd, unique, nodeid, flags, pid)
        if reply is not None:
            self._reply_open(fd, unique, reply)

    def _open_compiled(self, fd: int, unique: int, nodeid: int, flags: int, pid: int):
        """OPEN from the compiled loop: as :meth:`_open_request` (the loop writes the reply); never raises."""
        try:
            return self._open_request(fd, unique, nodeid, flags, pid)
        except KeyError:
            self._send(fd, unique, P.OPEN, errno.ENOENT, ())
        except Exception as e:
            self._fail(fd, unique, P.OPEN, nodeid, e)
        return None

    def _open_request(self, fd: int, unique: int, nodeid: int, flags: int, pid: int):
        """An OPEN with its ``flags`` (fuse_open_in) and opener ``pid``: a hit returns ``(fh, open_flags,
        backing_id)`` for the caller to reply with; an error is replied here and a miss handed to a worker
        (None). Raises KeyError for an unknown node id."""
        node = self.node_of(nodeid)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            self._send(fd, unique, P.OPEN, errno.EROFS, ())
            return None
        if node >= self._num_files:
            self._send(fd, unique, P.OPEN, errno.EISDIR, ())
            return None
        # until its handle is in self._files (or it failed): the file is opening (open_now)
        self._opening[unique] = node
        try:
            return self._open_counted(fd, unique, node, pid)
        finally:
            if unique not in self._pending:  # not handed to a worker (which lets go of it)
                self._opening.pop(unique, None)

    def _open_counted(self, fd: int, unique: int, node: int, pid: int):
        # the rest of _open_request: the cache counts the open; a hit's handle is registered here
        try:
            h = None
            if self._open_kept is not None:
                # an NVMe hit of a file whose backing id we hold: counted without opening its entry
                gen = self.modes.gen_of(node)
                if gen is not None:
                    h = self._open_kept(node, gen, pid)
                    if h is not None:
                        self.kept_opens += 1
            if h is None:
                h = self._open_nowait(node, True, pid)
        except Exception as e:
            self._fail(fd, unique, P.OPEN, self.ns.path(node), e)
            return None
        if h is None:
            self._defer(fd, unique, self._open_slow, node, None, pid)
        elif h.__class__ is OpenTicket:
            if (self.reader_misses and not h.joins and time.monotonic() >= self._reader_misses_after
                    and self.reader_watch.room()):
                return self._open_on_reader(fd, unique, node, h)
            # the ticket is served even if the open is interrupted first: it may lead a fetch that other
            # opens of the file wait on (its handle is then released)
            self._defer(fd, unique, self._open_slow, node, h, pid, always=True)
        elif self.source_mode != "off" and h.source == "backend":
            # a chunked file: whether it goes to the source file, and that open and check, on a worker
            # (an open of the source may wait on it: NFS)
            self._defer(fd, unique, self._open_source, node, h, always=True)
        else:
            try:
                return self._handle_here(fd, unique, node, h)
            except BackingConflict as e:
                self._refuse(fd, unique, node, e)
        return None

    def _handle_here(self, fd: int, unique: int, fid: int, h):
        """Reader: :meth:`_open_handle` of ``h`` on this thread, or None when handed to a worker. An open
        waits for a RELEASE (a dropped entry generation's backing file still open) only where another
        thread reads it: on this one with more than one reader, else on a worker.

        Raises:
            BackingConflict: as :meth:`_open_handle` (``h`` is released).
        """
        if self.nreaders > 1:
            return self._open_handle(fid, h, True)
        if self.modes is not None and self.modes.conflicted(fid, getattr(h, "gen", 0)):
            self._defer(fd, unique, self._open_source, fid, h, always=True)
            return None
        return self._open_handle(fid, h, False)

    def _open_on_reader(self, fd: int, unique: int, fid: int, ticket):
        """Reader: a miss this open leads (or a file no tier admits), served here rather than handed to a
        worker (a thread hand-off, two GIL switches), for a directory source that has been answering fast.
        Returns the reply triple as :meth:`_open_request` does, or None (answered here).

        A miss that holds this reader longer than :data:`~shadefs.fuse.spare.SPARE_AFTER_S` gets a spare
        reader started in its place (:attr:`reader_watch`); this reader then ends once the miss is over.
        When misses take longer than :data:`READER_MISS_MAX_S` on average (a slow source), misses go to
        the workers for :data:`READER_MISS_BACKOFF_S`. A read stuck past ``--backend-timeout`` is answered
        EIO by the backend's watchdog (:meth:`_reader_stuck`); the request is registered as pending
        meanwhile, so an INTERRUPT or the watchdog answers it once."""
        rec = self.reader_watch.begin(fd)
        try:
            return self._serve_on_reader(fd, unique, fid, ticket)
        finally:
            if self.reader_watch.end(rec):
                stop = getattr(self._reader_local, "stop", None)
                if stop is not None:
                    stop.retired = stop.stopped = True

    def _start_spare(self, fd: int) -> None:
        # the reader watch's: a reader is held by a slow miss; a fresh one reads fd's requests meanwhile
        if self._stop.stopped:
            return
        self.spare_readers += 1
        threading.Thread(target=self._reader, args=(fd,), name="fuse-reader-spare", daemon=True).start()

    def _serve_on_reader(self, fd: int, unique: int, fid: int, ticket):
        # the miss of _open_on_reader, on this reader thread
        with self._plock:
            self._pending[unique] = fd
        self.reader_misses_served += 1
        t0 = time.monotonic()
        stuck: list = []  # the watchdog's mark: this miss went past the deadline (its backoff started then)
        try:
            # the backend's reads, and the open of the source file for passthrough to it, under its deadline
            with on_deadline(lambda e: self._reader_stuck(fd, unique, stuck)):
                h = self._open_ticket(ticket)
                reply = self._handle_here(fd, unique, fid, h)
        except BackingConflict as e:
            self._reader_miss_took(t0, stuck)
            if self._finish(unique):
                self._refuse(fd, unique, fid, e)
            return None
        except Exception as e:
            self._reader_miss_took(t0, stuck)
            if self._finish(unique):
                self._fail(fd, unique, P.OPEN, self.ns.path(fid), e)
            return None
        self._reader_miss_took(t0, stuck)
        if reply is None:  # its io mode waits on a worker, which replies
            return None
        if not self._finish(unique):  # interrupted, or answered EIO at the deadline, meanwhile
            self._drop(reply[0])
            return None
        return reply

    def _reader_miss_took(self, t0: float, stuck: list) -> None:
        if stuck:
            return  # counted at its deadline
        now = time.monotonic()
        avg = self._reader_miss_s = self._reader_miss_s + (now - t0 - self._reader_miss_s) * 0.03125
        if avg > READER_MISS_MAX_S:
            self.reader_misses_slow += 1
            self._reader_misses_after = now + READER_MISS_BACKOFF_S
            self._reader_miss_s = READER_MISS_MAX_S  # after the backoff, the next miss on a reader decides

    def _reader_stuck(self, fd: int, unique: int, stuck: list) -> None:
        """The backend's watchdog, for a reader whose miss is past ``--backend-timeout``: answer the OPEN
        EIO and send misses to the workers (backoff). A spare reader serves in its place since the miss
        passed ``SPARE_AFTER_S`` (:attr:`reader_watch`); the stuck one ends once its read returns."""
        stuck.append(True)
        self.reader_misses_slow += 1
        self._reader_misses_after = time.monotonic() + READER_MISS_BACKOFF_S
        self._reader_miss_s = READER_MISS_MAX_S
        if self._finish(unique):
            self._send(fd, unique, P.OPEN, errno.EIO, ())

    def _open_source(self, fd: int, unique: int, fid: int, h) -> None:
        """Worker: an open whose handle the reader handed over: one served from the source
        (:meth:`_open_handle` may open the source file, which may wait), or one whose io mode waits for a
        RELEASE (:meth:`_handle_here`); the request stays interruptible until it is answered."""
        self._opened(fd, unique, fid, h)

    def _open_slow(self, fd: int, unique: int, fid: int, ticket, pid: Optional[int] = None) -> None:
        """Worker: a miss (waits on the backend, or on another open's fetch of the same file); ``ticket``:
        the reader's lookup of it (:meth:`TieredCache.open_ticket`), or None; ``pid``: the opener."""
        try:
            # the backend's reads run on this thread; at a deadline its watchdog answers the open
            with on_deadline(lambda e: self._past_deadline(fd, unique)):
                h = self.cache.open(fid, pid) if ticket is None else self._open_ticket(ticket)
        except Exception as e:
            self._opening.pop(unique, None)
            if self._finish(unique):
                self._fail(fd, unique, P.OPEN, self.ns.path(fid), e)
            return
        self._opened(fd, unique, fid, h)

    def _past_deadline(self, fd: int, unique: int) -> None:
        """The backend's watchdog, for a worker whose read is past ``--backend-timeout``: answer its OPEN
        EIO now (the watchdog logged the path); the worker's late answer is dropped (:meth:`_finish`)."""
        if self._finish(unique):
            self._send(fd, unique, P.OPEN, errno.EIO, ())

    def _opened(self, fd: int, unique: int, fid: int, h) -> None:
        """Worker: answer a deferred OPEN with a handle for ``h``, unless it was interrupted meanwhile (then
        the handle is released). The handle is made first (an open of the source file may wait on it), so
        an INTERRUPT that comes meanwhile is answered at once."""
        try:
            # the open of the source file for passthrough to it may hang (a FIFO, a hung NFS server): at the
            # backend's deadline its watchdog answers the open EIO
            with on_deadline(lambda e: self._past_deadline(fd, unique)):
                reply = self._open_handle(fid, h)
        except BackingConflict as e:
            if self._finish(unique):
                self._refuse(fd, unique, fid, e)
            return
        except Exception as e:  # the source file refused or changed (cache.source_fd): as a read of it fails
            if self._finish(unique):
                self._fail(fd, unique, P.OPEN, self.ns.path(fid), e)
            return
        finally:
            self._opening.pop(unique, None)  # registered in self._files, or failed
        if not self._finish(unique):  # interrupted meanwhile: the opener is gone
            self._drop(reply[0])
            return
        self._reply_open(fd, unique, reply)

    def _refuse(self, fd: int, unique: int, fid: int, e: BackingConflict) -> None:
        """An open that would read a dropped (corrupt) entry through the kernel's backing file: EIO."""
        if e.first:
            log.warning("open of %r refused (EIO): %s; it is served again once they are closed (logged once, "
                        "counted at unmount)", self.ns.path(fid), e.strerror)
        self._send(fd, unique, P.OPEN, errno.EIO, ())

    def _reply_open(self, fd: int, unique: int, reply: Tuple[int, int, int]) -> None:
        if not self._send(fd, unique, P.OPEN, 0, (P.encode_open_out(*reply),)):
            self._drop(reply[0])  # the opener was interrupted: no RELEASE will come for this fh

    def _open_handle(self, fid: int, h, may_wait: bool = True) -> Tuple[int, int, int]:
        """A new file handle for ``h``: its ``(fh, open_flags, backing_id)`` (``may_wait``: see
        :meth:`_Modes.acquire`).

        Raises:
            BackingConflict: opens of a dropped generation of the file hold its backing file (``h`` is
                released).
        """
        backing_id = None
        src = None
        if self.modes is not None:
            try:
                if (self.source_mode != "off" and h.source == "backend" and h.gen == 0
                        and not self.modes.on_entry(fid)):
                    # served from the source: the source file itself, when the cache says so; acquire
                    # registers it if no other open of the file holds an io mode then, else joins that mode
                    # (opened and checked first: an open the cache serves itself, e.g. a chunked file the
                    # tiers hold whole, never waits; the earlier opens' RELEASEs may come meanwhile). An
                    # open that finds the file's mode on an entry's backing file (the same bytes) joins it
                    # without opening the source file.
                    src = self.cache.source_fd(h)
                    if src is not None and may_wait and fid in self.modes.files:
                        self.modes.wait_uncached(fid, SOURCE_RELEASE_WAIT_S)
                backing_id = self.modes.acquire(fid, h, may_wait, src)
            except BaseException:
                h.release()
                if src is not None:
                    os.close(src)
                raise
        if backing_id is not None:
            flags = P.FOPEN_PASSTHROUGH
            self.passthrough_opens += 1
            st = self.modes.files.get(fid)  # this open holds it: the same record until its release
            if st is not None and st.gen == -1:  # the kernel reads the source file for it
                self.source_opens += 1
                self.cache.source_opened(h)
                if src is not None and self.cache.fds.hold(src):
                    h, src = SourceReads(h, src, self.cache.fds), None  # its read-ahead READs: the source file
                # (past the descriptor reserve they are served by ranges from the backend; src closed below)
            elif type(h) is Handle:
                # the kernel reads the entry file through its own reference (the backing id): the open holds
                # no descriptor of the daemon, however many opens a reader keeps (the descriptor reserve)
                h.close_entry_fd()
        elif self.kernel_cache and h.keep_pages:
            # a hit, or a file no tier holds, serves the bytes the kernel may still hold (the mount is a
            # snapshot); a miss that fills a tier drops them (Handle.keep_pages)
            flags = P.FOPEN_KEEP_CACHE
        else:
            flags = 0
        if src is not None:
            os.close(src)  # the kernel holds its own reference to a registered backing file; else unused
        fh = next(self._next_fh)
        # reads that wait on the backend (or on the source file) go to a worker
        self._files[fh] = (h, fid, h.source != "memory" and h.source != "entry")
        return fh, flags, backing_id or 0

    def _drop(self, fh: int) -> None:
        entry = self._files.pop(fh, None)
        if entry is None:
            return
        h, fid, _ = entry
        if self.modes is not None:
            self.modes.release(fid)
        h.release()

    def _read(self, fd, unique, nodeid, buf, n) -> None:
        fh, offset, size, _, _, _, _ = P.READ_IN.unpack_from(buf, P.IN_HEADER.size)
        entry = self._files.get(fh)
        if entry is None:
            self._send(fd, unique, P.READ, errno.EBADF, ())
            return
        h, fid, blocking = entry
        if blocking:
            self._defer(fd, unique, self._read_slow, h, fid, offset, size)
            return
        try:
            data = h.read(offset, size)
        except Exception as e:
            self._fail(fd, unique, P.READ, self.ns.path(fid), e)
            return
        self._send(fd, unique, P.READ, 0, (data,), size)

    def _read_slow(self, fd: int, unique: int, h, fid: int, offset: int, size: int) -> None:
        try:
            data = h.read(offset, size)
        except Exception as e:
            if self._finish(unique):
                self._fail(fd, unique, P.READ, self.ns.path(fid), e)
            return
        if self._finish(unique):
            self._send(fd, unique, P.READ, 0, (data,), size)

    def _release(self, fd, unique, nodeid, buf, n) -> None:
        (fh,) = P.RELEASE_IN.unpack_from(buf, P.IN_HEADER.size)[:1]
        self._drop(fh)
        self._send(fd, unique, P.RELEASE, 0, ())

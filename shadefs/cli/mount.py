"""``shadefs mount``: lock the mountpoint, check, fork the daemon and wait until it serves (or say why
it did not); Ctrl-C at any point leaves nothing mounted. Also the daemon's logging and its build step."""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import time
from typing import Optional

from ..cmdutil import UserError, is_mounted
from ..config import ConfigError, MountConfig, format_bytes, pause_point
from .fusermount import _registry, _unmount
from .options import build_config
from .preflight import check_machine, check_trace_overwrite, preflight
from .stats import tier_budget


def _default_log_file(mountpoint: str) -> str:
    """``$TMPDIR/shadefs-<euid>/<mountpoint with / as _>.log``. The directory is created 0700, or refused
    (UserError) when another user could have planted it, or a symlink in it: a symlink or a directory
    not ours, group/other bits, or a log file that is a symlink (a root daemon would append to whatever it
    names)."""
    from ..fsutil import private_dir

    try:
        d = private_dir(os.path.join(tempfile.gettempdir(), f"shadefs-{os.geteuid()}"), "the log")
    except OSError as e:
        raise UserError(f"log directory: {e.strerror or e} (or pass --log-file FILE)") from None
    slug = mountpoint.strip("/").replace("/", "_") or "root"
    path = os.path.join(d, f"{slug}.log")
    if os.path.islink(path):
        raise UserError(f"log file {path!r} is a symlink; remove it (or pass --log-file FILE)")
    return path


class _LogFileHandler(logging.FileHandler):
    """A FileHandler that never follows a symlink at the log's own name (``O_NOFOLLOW``: ELOOP instead)
    and creates the file 0600 (the log names source paths)."""

    def _open(self):
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)


def _setup_logging(level: str, log_file: Optional[str]) -> None:
    handler = _LogFileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # object-store clients log whole responses at debug level: keep them to warnings
    for name in ("botocore", "aiobotocore", "s3fs", "fsspec", "urllib3", "aiohttp"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(level)))


def _is_refusal(e: BaseException) -> bool:
    """An error of the daemon's build step that is the user's to fix (exit 2, like the CLI's checks)."""
    from ..backends.base import BackendError
    from ..cache.tiers import CacheDirInUse

    return isinstance(e, (CacheDirInUse, ConfigError, BackendError, ValueError, PermissionError))


def _run_daemon(cfg: MountConfig, ready_fd: Optional[int], stderr_file=None) -> int:
    """Build and serve (in the forked daemon). A failure before the mount is reported on ``ready_fd``
    as ``refused: MESSAGE`` (the user's to fix: exit 2) or ``error: MESSAGE``; when the mount itself
    failed, what the FUSE library or fusermount wrote on stderr (``stderr_file``) is the message."""
    from ..daemon import Daemon

    daemon = Daemon(cfg, ready_fd)
    try:
        daemon.build()
    except BaseException as e:
        logging.getLogger("shadefs").exception("daemon failed")
        daemon._notify(f"{'refused' if _is_refusal(e) else 'error'}: {e}")
        return 1
    try:
        daemon.run()
    except BaseException as e:  # report to the waiting parent, then exit
        logging.getLogger("shadefs").exception("daemon failed")
        daemon._notify(f"error: {_mount_error(e, stderr_file)}")
        return 1
    return 0


def _mount_error(e: BaseException, stderr_file) -> str:
    """What to tell the user about a failed mount: the mount helper's own words if it left any."""
    said = ""
    if stderr_file is not None:
        try:
            stderr_file.flush()
            stderr_file.seek(0)
            lines = [ln.strip() for ln in stderr_file.read().decode("utf-8", "replace").splitlines() if ln.strip()]
            said = "; ".join(lines[-3:])
        except (OSError, ValueError):
            pass
    text = str(e)
    if said:
        return said if not text or text.isdigit() else f"{text} ({said})"
    if not text or text.isdigit():  # mfusepy raises RuntimeError(<fuse_main's status>)
        return f"the FUSE library could not mount (status {text or '?'}) and said nothing; check /dev/fuse, " \
               "fusermount and CAP_SYS_ADMIN"
    return text


def _stop_daemon(pid: int, grace_s: float = 3.0) -> None:
    """SIGTERM the daemon's process group, SIGKILL after ``grace_s``, and reap it."""
    import signal

    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return
            if done:
                return
            time.sleep(0.02)


# -- commands -------------------------------------------------------------------------------------------
def _hold_mountpoint(mountpoint: str):
    """This user's lock on ``mountpoint`` (:func:`shadefs.registry.hold_mountpoint`), taken before the
    mountpoint is checked and kept by the daemon for its life: of two mounts racing onto one directory,
    the second is refused here. Returns the lock file (raises UserError)."""
    reg = _registry()
    try:
        return reg.hold_mountpoint(mountpoint, wait_s=5.0, busy=lambda: is_mounted(mountpoint))
    except reg.MountpointBusy as e:
        if is_mounted(mountpoint):
            raise UserError(f"mountpoint {mountpoint!r} is already mounted") from None
        raise UserError(f"{e}: a shadefs mount there is starting, or its daemon has not exited "
                        f"(if it hangs: shadefs umount --force {mountpoint})") from None
    except OSError as e:
        raise UserError(f"cannot lock the mountpoint: {e}") from None


def cmd_mount(args) -> int:
    """Mount (see the module's docstring). Ctrl-C before the mount is reported ends with one line, status
    130 and nothing mounted: a daemon already forked is stopped (its process group), a mount it made is
    unmounted; Ctrl-C before the fork has changed nothing (:func:`shadefs.cli.main` says so)."""
    cfg = build_config(args)
    check_machine(cfg)
    mp_lock = _hold_mountpoint(cfg.mountpoint)  # held until the daemon exits (inherited by the fork)
    preflight(cfg)
    check_trace_overwrite(cfg, getattr(args, "trace_overwrite", False))
    if cfg.foreground:
        _setup_logging(cfg.log_level, cfg.log_file)
        try:
            return _run_daemon(cfg, None)
        except KeyboardInterrupt:  # during the build (once mounted, SIGINT unmounts: the front end's)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            print(f"shadefs: interrupted; nothing is mounted at {cfg.mountpoint}", file=sys.stderr, flush=True)
            return 130
    log_file = cfg.log_file or _default_log_file(cfg.mountpoint)
    pause_point("cli-checked")
    r, w = os.pipe()
    # SIGINT stays pending across the fork: the child starts with no KeyboardInterrupt of its parent's
    # (nor one inside the at-fork handlers, which would leave a lock held), and the parent takes it only
    # once the daemon's pid is known, inside the try below that stops it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    pid = os.fork()
    if pid == 0:  # the daemon
        code = 1
        try:
            os.close(r)
            _registry().note_holder(mp_lock)
            os.setsid()  # a terminal's Ctrl-C reaches the command, which stops the daemon
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            _setup_logging(cfg.log_level, log_file)
            devnull = os.open(os.devnull, os.O_RDWR)
            err = tempfile.TemporaryFile()  # what libfuse / fusermount say about a failed mount
            for fd in (0, 1):
                os.dup2(devnull, fd)
            os.dup2(err.fileno(), 2)
            code = _run_daemon(cfg, w, err)
        finally:
            os._exit(code)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        os.close(w)
        mp_lock.close()  # the daemon holds it now
        pause_point("cli-forked")
        line = _wait_ready(r, cfg.source)
        if line == "ok" or line.startswith("ok "):
            pause_point("cli-ready")
            _print_mounted(cfg, pid, log_file, line[3:])
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # reported mounted: it stays
            return 0
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(f"shadefs: interrupted; {_abort_start(cfg, pid)}", file=sys.stderr, flush=True)
        return 130
    os.waitpid(pid, 0)
    kind, sep, msg = line.partition(": ")
    if not sep or kind not in ("error", "refused"):
        kind, msg = "error", f"the daemon exited; see {log_file}"
    if kind == "refused":
        raise UserError(msg)
    print(f"shadefs: mount failed: {msg}", file=sys.stderr)
    return 1


def _abort_start(cfg: MountConfig, pid: int) -> str:
    """Undo a mount the user interrupted: stop the daemon ``pid`` (wherever its start is: its process
    group, SIGTERM then SIGKILL), unmount what it mounted, and say what was done (one phrase)."""
    _stop_daemon(pid)  # the daemon runs in its own session: the SIGINT did not reach it
    reg = _registry()
    if is_mounted(cfg.mountpoint) and reg.is_shadefs(reg.mount_entry(cfg.mountpoint)):
        try:
            _unmount(cfg.mountpoint, lazy=True)  # a daemon killed while mounted left its mount behind
        except UserError as e:
            return f"stopped the daemon (pid {pid}), {e}; run: shadefs umount --force {cfg.mountpoint}"
    left = reg.lookup(cfg.mountpoint, alive_only=False)
    if left is not None and left.pid == pid:  # killed after it registered: its entry and control socket
        reg.remove(left)
    return f"stopped the daemon (pid {pid}), nothing is mounted at {cfg.mountpoint}"


SCAN_QUIET_S = 2.0      # a scan done sooner says nothing
SCAN_REPORT_EVERY_S = 5.0


def _wait_ready(fd: int, source: str) -> str:
    """Read the daemon's pipe (``fd``, closed here) until its last line (``ok ...``, ``error: ...``,
    ``refused: ...``; "" if it exited without one), which is returned. Until the daemon says
    ``scanned FILES DIRS``, its ``scan FILES DIRS`` lines say how far the scan is: after SCAN_QUIET_S, and
    then every SCAN_REPORT_EVERY_S, one line on stderr (also while nothing comes: a source that hangs
    shows 0 files)."""
    import select

    t0 = time.monotonic()
    buf, files, dirs = b"", 0, 0
    scanning, reported = True, None  # reported: when the last progress line was printed
    try:
        while True:
            timeout = None
            if scanning:
                due = t0 + SCAN_QUIET_S if reported is None else reported + SCAN_REPORT_EVERY_S
                timeout = due - time.monotonic()
                if timeout <= 0:
                    reported = time.monotonic()
                    print(f"shadefs: scanning {source}: {files} files in {dirs} directories so far "
                          f"({reported - t0:.0f} s; Ctrl-C stops the mount)", file=sys.stderr, flush=True)
                    continue
            if not select.select([fd], [], [], timeout)[0]:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                return buf.decode("utf-8", "replace").strip()
            buf += chunk
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                line = raw.decode("utf-8", "replace").strip()
                kind, _, rest = line.partition(" ")
                if kind not in ("scan", "scanned"):
                    return line
                try:
                    files, dirs = (int(x) for x in rest.split())
                except ValueError:
                    continue
                if kind == "scanned" and scanning:
                    scanning = False
                    if reported is not None:
                        print(f"shadefs: scanned {source}: {files} files in {dirs} directories in "
                              f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        os.close(fd)


def _print_mounted(cfg: MountConfig, pid: int, log_file: str, summary_json: str) -> None:
    """The "mounted" line (stdout): tiers, policy, log; the metrics URL; the daemon's warnings (stderr)."""
    try:
        info = json.loads(summary_json) if summary_json.strip() else {}
    except ValueError:
        info = {}
    tiers = [f"RAM tier {format_bytes(info['ram_bytes']) if info.get('ram_bytes') else 'off'}"]
    if "disk_bytes" in info:
        tiers.append(f"disk tier {format_bytes(info['disk_bytes'])} in {info['disk_dir']}" if info["disk_bytes"]
                     else "disk tier off")
    if info.get("shared_bytes"):
        tiers.append(f"shared tier {format_bytes(info['shared_bytes'])}")
    print(f"shadefs: mounted {cfg.source} at {cfg.mountpoint} (pid {pid}, policy {cfg.policy}, "
          f"{', '.join(tiers)}, log {log_file})")
    if info.get("disk_tier"):
        print(f"shadefs: {tier_budget('disk', info['disk_tier'])}")
    if info.get("metrics_url"):
        print(f"shadefs: Prometheus metrics on {info['metrics_url']}")
    for w in info.get("warnings", ()):
        print(f"shadefs: warning: {w}", file=sys.stderr)

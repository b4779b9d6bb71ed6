"""``shadefs umount``: unmount a shadefs mount (never another filesystem's), clear a stale one, and
with ``--force`` end a daemon that hangs, is stopped or outlived its mount."""
from __future__ import annotations

import os
import sys
import time
from typing import Optional

from ..cmdutil import UserError, is_mounted
from ..cmdutil import is_stale as _is_stale
from .fusermount import _registry, _unmount


def _wait_gone(pid: Optional[int], mountpoint: str, timeout_s: float = 10.0) -> None:
    from ..registry import pid_start_time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_mounted(mountpoint) and (pid is None or pid_start_time(pid) is None):
            return
        time.sleep(0.05)


#: how long ``shadefs umount`` waits for the daemon to exit after its mount is gone (it writes its last
#: checkpoint first); a daemon stopped (SIGSTOP) for STOPPED_S seconds is reported at once
EXIT_WAIT_S = 30.0
STOPPED_S = 1.0


def _pid_state(pid: int) -> str:
    """The state letter of ``/proc/PID/stat`` (R, S, D, T (stopped), t, Z (zombie)...); "" if gone."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""


def _daemon_runs(entry) -> bool:
    """The registered daemon still runs: same pid and start time, not a zombie."""
    return entry.alive() and _pid_state(entry.pid) not in ("", "Z")


def _wait_exit(entry, timeout_s: float = EXIT_WAIT_S) -> Optional[str]:
    """Wait for the registered daemon ``entry`` (None: unknown, nothing to wait for) to exit after its
    unmount. Returns None once it has, else why not: ``"is stopped (SIGSTOP)"`` or ``"did not exit within
    N s"``."""
    if entry is None:
        return None
    deadline = time.monotonic() + timeout_s
    stopped_since = None
    while _daemon_runs(entry):
        now = time.monotonic()
        if _pid_state(entry.pid) in ("T", "t"):
            stopped_since = stopped_since or now
            if now - stopped_since >= STOPPED_S:
                return "is stopped (SIGSTOP)"
        else:
            stopped_since = None
        if now >= deadline:
            return f"did not exit within {timeout_s:g} s"
        time.sleep(0.05)
    return None


def _terminate(entry, grace_s: float) -> bool:
    """End the registered daemon ``entry``: SIGTERM and SIGCONT (a stopped daemon then runs its handler:
    it unmounts and writes its last checkpoint), SIGKILL after ``grace_s`` seconds, then up to 5 s for it
    to go. Never signals a pid that is no longer the daemon's (gone, or reused). Returns whether it is gone."""
    import signal

    for sigs, wait_s in (((signal.SIGTERM, signal.SIGCONT), grace_s), ((signal.SIGKILL,), 5.0)):
        if not _daemon_runs(entry):
            return True
        for sig in sigs:
            try:
                os.kill(entry.pid, sig)
            except ProcessLookupError:
                return True
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _daemon_runs(entry):
                return True
            time.sleep(0.02)
    return not _daemon_runs(entry)


def _unmount_if_mounted(mountpoint: str) -> None:
    """Lazily unmount ``mountpoint`` unless it is gone already (a daemon ending unmounts itself)."""
    try:
        if is_mounted(mountpoint):
            _unmount(mountpoint, lazy=True)
    except UserError:
        if is_mounted(mountpoint):
            raise


def cmd_umount(args) -> int:
    """Unmount a shadefs mount; refuse anything else. A daemon that does not exit after its unmount is an
    error (exit 1). ``--force``: a daemon that does not answer its control endpoint within ``--timeout``,
    or does not exit after the unmount, or still runs after its mount is gone, is ended (SIGTERM, SIGKILL
    after ``--timeout`` seconds) and its mount cleared."""
    reg = _registry()
    mp = os.path.abspath(args.mountpoint)
    info = reg.mount_entry(mp)
    known = reg.lookup(mp, alive_only=False)
    entry = known if known is not None and known.alive() else None
    if info is None:
        if entry is not None:  # the daemon runs but its mount is gone (unmounted by hand, or it hung)
            if not args.force:
                raise UserError(f"{mp!r} is not mounted, but its daemon (pid {entry.pid}) still runs; end it "
                                f"with: shadefs umount --force {mp}")
            return _end_daemon(entry, mp, args.timeout, "its mount was already gone")
        raise UserError(f"{mp!r} is not mounted")
    if not reg.is_shadefs(info):
        raise UserError(f"{mp!r} is a {info.fstype} mount ({info.source}), not a shadefs mount; refusing to "
                        "unmount it")
    # A registered live daemon means the mount is not stale: never stat a mount that may hang.
    if entry is None and ((known is not None and not known.alive()) or _is_stale(mp)):
        _unmount(mp, lazy=True)
        print(f"shadefs: cleared a stale mount at {mp} (its daemon had died)", file=sys.stderr)
        if known is not None:
            reg.remove(known)  # its entry and its control socket
        return 0
    if args.force and (entry is None or not _answers(entry, args.timeout)):
        if entry is not None:
            print(f"shadefs: the daemon (pid {entry.pid}) did not answer within {args.timeout:g} s; "
                  "killing it", file=sys.stderr)
            _terminate(entry, args.timeout)
        _unmount_if_mounted(mp)
        _wait_gone(entry.pid if entry else None, mp)
        if entry is not None:
            reg.remove(entry)  # its entry and its control socket
        return 0
    try:
        _unmount(mp)
    except UserError as e:
        busy = _busy_text(mp, str(e))
        if busy is None:
            raise
        if not args.force:
            raise UserError(f"{busy}; close or end them and run again, or run: shadefs umount --force {mp} "
                            f"(detaches the mount at once and ends its daemon: those processes' next access to "
                            f"it fails, ENOTCONN)") from None
        _unmount(mp, lazy=True)
        print(f"shadefs: {busy}; detached it", file=sys.stderr)
        if entry is None:
            return 0
        return _end_daemon(entry, mp, args.timeout, "its mount was busy, and is detached")
    why = _wait_exit(entry)
    if why is None:
        return 0
    if args.force:
        return _end_daemon(entry, mp, args.timeout, f"it {why} after the unmount")
    print(f"shadefs: error: unmounted {mp}, but its daemon (pid {entry.pid}) {why}; a new mount there is "
          f"refused until it exits: end it with: shadefs umount --force {mp}", file=sys.stderr)
    return 1


def _busy_text(mp: str, error: str) -> Optional[str]:
    """``MP is busy: held by pid N (COMMAND: USES), ...`` when the unmount failed because processes use the
    mount (fusermount's "Device or resource busy", umount's "target is busy"), else None."""
    from ..procutil import holders

    if "busy" not in error.lower():
        return None
    found = holders(mp)
    if not found:
        return f"{mp} is busy (no process that this user may inspect holds it: {error})"
    named = [f"pid {pid} ({command}: {', '.join(uses)})" for pid, command, uses in found[:10]]
    more = f" and {len(found) - 10} more" if len(found) > 10 else ""
    return f"{mp} is busy: held by {'; '.join(named)}{more}"


def _end_daemon(entry, mp: str, grace_s: float, why: str) -> int:
    """``umount --force`` of a daemon whose mount is gone: end it (:func:`_terminate`), drop its entry."""
    print(f"shadefs: ending the daemon of {mp} (pid {entry.pid}): {why}", file=sys.stderr)
    if not _terminate(entry, grace_s):
        print(f"shadefs: error: the daemon (pid {entry.pid}) survived SIGKILL", file=sys.stderr)
        return 1
    _registry().remove(entry)  # its entry and its control socket
    return 0


def _answers(entry, timeout_s: float) -> bool:
    from ..control.client import ControlClient

    c = ControlClient(entry.endpoint, timeout_s=timeout_s, credentials=entry.credentials)
    try:
        c.stats()
        return True
    except Exception:
        return False
    finally:
        c.close()

"""The ``shadefs`` command: mount, umount, stats, endpoint, warm, simulate.

Every user error is one line on stderr and a non-zero exit, before anything is mounted: the mount
command validates the source, the mountpoint, /dev/fuse, fusermount, the cache directory, the sizes and
the policy, and only then forks the daemon and waits until the mount is ready.

One module a job: :mod:`.parser` (the command line), :mod:`.options` (mount options to a MountConfig),
:mod:`.preflight` (the checks before the fork), :mod:`.mount`, :mod:`.umount`, :mod:`.stats` (stats and
endpoint), :mod:`.fusermount` (unmounting and the registry of mounts). Their public names are re-exported
here (``from shadefs.cli import is_mounted`` and the rest keep working).
"""
from __future__ import annotations

import os
import signal
import sys
from typing import List, Optional

from ..cmdutil import UserError, is_mounted
from .mount import cmd_mount
from .options import build_config
from .parser import _attach_negative_sizes, cmd_simulate, cmd_version, cmd_warm, make_parser
from .preflight import FUSE_DEVICE, check_fuse_device, check_machine, check_trace_overwrite, preflight
from .stats import STATS_KEYS, cmd_endpoint, cmd_stats, format_stats, tier_budget
from .umount import _terminate, cmd_umount

__all__ = ["FUSE_DEVICE", "STATS_KEYS", "UserError", "build_config", "check_fuse_device", "check_machine",
           "check_trace_overwrite", "cmd_endpoint", "cmd_mount", "cmd_simulate", "cmd_stats", "cmd_umount",
           "cmd_version", "cmd_warm", "format_stats", "is_mounted", "main", "make_parser", "preflight",
           "tier_budget", "_terminate"]


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); return its exit status: 0, 1 (the command
    failed), 2 (a user error, one line on stderr) or 130 (Ctrl-C before the command changed anything)."""
    args = make_parser().parse_args(_attach_negative_sizes(sys.argv[1:] if argv is None else list(argv)))
    try:
        return args.func(args)
    except UserError as e:
        print(f"shadefs: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # one the command did not handle itself: it had changed nothing yet
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("shadefs: interrupted" + ("; nothing is mounted" if args.func is cmd_mount else ""), file=sys.stderr,
              flush=True)
        return 130
    except BrokenPipeError:  # `shadefs stats MNT | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0

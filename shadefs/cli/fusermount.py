"""The system's mount helpers as the commands use them: fusermount (or umount) to unmount, and the
registry of this user's mounts (:mod:`shadefs.registry`, imported when first used)."""
from __future__ import annotations

import shutil
import subprocess
from typing import Optional

from ..cmdutil import UserError


def _fusermount() -> Optional[str]:
    return shutil.which("fusermount3") or shutil.which("fusermount")


def _unmount(mountpoint: str, lazy: bool = False) -> None:
    tool = _fusermount()
    cmds = []
    if tool:
        cmds.append([tool, "-u"] + (["-z"] if lazy else []) + [mountpoint])
    cmds.append(["umount"] + (["-l"] if lazy else []) + [mountpoint])
    last = ""
    for cmd in cmds:
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
        except FileNotFoundError:
            continue
        if r.returncode == 0:
            return
        last = (r.stderr or r.stdout).strip()
    raise UserError(f"cannot unmount {mountpoint}: {last or 'no fusermount or umount available'}")


def _forget_dead(mountpoint: str) -> None:
    """Remove the registry entry and control socket a dead daemon of ``mountpoint`` left."""
    reg = _registry()
    known = reg.lookup(mountpoint, alive_only=False)
    if known is not None and not known.alive():
        reg.remove(known)


def _registry():
    from .. import registry

    return registry

"""Running a piece of a test as another user (uid/gid 65534, "nobody"), in a forked child.

For the permission tests of a live mount (tests/integration/test_security.py, test_kernel_frontend.py): the
child drops its supplementary groups, then its gid, then its uid, runs ``fn()`` and exits with a code that
says how ``fn`` ended. Needs root (to change user); the caller waits with :func:`wait_exit_code`.
"""
from __future__ import annotations

import os
from typing import Callable

__all__ = ["NOBODY", "fork_as_nobody", "as_nobody", "wait_exit_code"]

NOBODY = 65534
"""uid and gid of the user "nobody"."""


def fork_as_nobody(fn: Callable[[], object]) -> int:
    """Run ``fn()`` in a forked child as uid/gid :data:`NOBODY`; returns the child's pid at once.

    The child's exit code: 0 when ``fn`` returns (its value is ignored), the errno when it raises
    ``OSError`` (255 for an OSError without one), 254 for any other exception (an AssertionError included).
    The child never returns into the caller's code (``os._exit``).
    """
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            fn()
        except OSError as e:
            code = e.errno or 255
        except BaseException:
            code = 254
        os._exit(code)
    return pid


def wait_exit_code(pid: int) -> int:
    """Wait for child ``pid``; returns its exit code (``-N`` when signal N killed it)."""
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def as_nobody(fn: Callable[[], object]) -> int:
    """Run ``fn()`` as uid/gid :data:`NOBODY` and wait: returns the errno it raised (0: none; the codes of
    :func:`fork_as_nobody`)."""
    return wait_exit_code(fork_as_nobody(fn))

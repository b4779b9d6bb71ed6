"""A baseline revision of this package beside the working tree, for benchmarks that compare side by side.

:func:`extract` writes ``git archive REV shadefs`` of a checkout into a temporary directory; a benchmark
then runs that side with ``PYTHONPATH`` set to it (or imports from it in a child process), the other side
from the working tree, in the same run.
"""
from __future__ import annotations

import subprocess
import tempfile
from typing import Sequence, Tuple

__all__ = ["extract"]


def extract(root: str, rev: str, prefix: str = "shadefs-baseline-",
            paths: Sequence[str] = ("shadefs",)) -> Tuple[str, str]:
    """Extract ``paths`` of revision ``rev`` of the git checkout at ``root`` into a new temporary directory.

    Returns ``(directory, short hash of rev)``; the caller removes the directory.

    Raises: ``subprocess.CalledProcessError`` when ``rev`` is not a revision of ``root`` (git's message is
    in its ``stderr``) or when git or tar fail.
    """
    short = subprocess.run(["git", "-C", root, "rev-parse", "--short", rev], check=True,
                           capture_output=True, text=True).stdout.strip()
    tmp = tempfile.mkdtemp(prefix=prefix)
    arch = subprocess.run(["git", "-C", root, "archive", short, *paths], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tmp], input=arch, check=True)
    return tmp, short

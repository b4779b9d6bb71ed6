"""A baseline revision of this package beside the working tree, for benchmarks that compare side by side.

:func:`extract` writes ``git archive REV shadefs`` of a checkout into a temporary directory; a benchmark
then runs that side with ``PYTHONPATH`` set to it (or imports from it in a child process), the other side
from the working tree, in the same run. A compiled extension of the working tree (``*.so``, built by
``pip install``) is copied beside its C source at REV when that source is the same file: both sides then
run the same compiled code where their sources agree (a revision's tree from ``git archive`` has no build),
and the Python fallback where they differ or REV has none.
"""
from __future__ import annotations

import glob
import os
import shutil
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
    for built in glob.glob(os.path.join(root, "shadefs", "**", "*.so"), recursive=True):
        rel = os.path.relpath(built, root)
        source = os.path.join(os.path.dirname(rel), os.path.basename(rel).split(".")[0] + ".c")
        theirs = os.path.join(tmp, source)
        if os.path.isfile(theirs) and _same(os.path.join(root, source), theirs):
            shutil.copy2(built, os.path.join(tmp, rel))
    return tmp, short


def _same(a: str, b: str) -> bool:
    try:
        with open(a, "rb") as f, open(b, "rb") as g:
            return f.read() == g.read()
    except OSError:
        return False

"""A baseline revision of this package beside the working tree, for benchmarks that compare side by side.

:func:`extract` writes ``git archive REV shadefs`` of a checkout into a temporary directory; a benchmark
then runs that side with ``PYTHONPATH`` set to it (or imports from it in a child process), the other side
from the working tree, in the same run. A compiled extension of the working tree (``*.so``, built by
``pip install``) is copied beside its C source at REV when that source is the same file: both sides then
run the same compiled code where their sources agree (a revision's tree from ``git archive`` has no build),
and the Python fallback where they differ or REV has none; with ``build=True`` the differing sources are
compiled in the extract instead (REV's ``setup.py build_ext --inplace``), so each side runs its own
compiled code.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Sequence, Tuple

__all__ = ["extract"]


def extract(root: str, rev: str, prefix: str = "shadefs-baseline-",
            paths: Sequence[str] = ("shadefs",), build: bool = False) -> Tuple[str, str]:
    """Extract ``paths`` of revision ``rev`` of the git checkout at ``root`` into a new temporary directory.

    Returns ``(directory, short hash of rev)``; the caller removes the directory. ``build``: compile REV's
    C sources that the working tree's builds do not match (REV's setup.py, ``build_ext --inplace``; where
    that fails, REV's Python fallbacks serve, as after an install without a compiler).

    Raises: ``subprocess.CalledProcessError`` when ``rev`` is not a revision of ``root`` (git's message is
    in its ``stderr``) or when git or tar fail.
    """
    short = subprocess.run(["git", "-C", root, "rev-parse", "--short", rev], check=True,
                           capture_output=True, text=True).stdout.strip()
    tmp = tempfile.mkdtemp(prefix=prefix)
    arch = subprocess.run(["git", "-C", root, "archive", short, *paths], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tmp], input=arch, check=True)
    copied = set()
    for built in glob.glob(os.path.join(root, "shadefs", "**", "*.so"), recursive=True):
        rel = os.path.relpath(built, root)
        source = os.path.join(os.path.dirname(rel), os.path.basename(rel).split(".")[0] + ".c")
        theirs = os.path.join(tmp, source)
        if os.path.isfile(theirs) and _same(os.path.join(root, source), theirs):
            shutil.copy2(built, os.path.join(tmp, rel))
            copied.add(source)
    sources = {os.path.relpath(c, tmp) for c in glob.glob(os.path.join(tmp, "shadefs", "**", "*.c"), recursive=True)}
    if build and sources - copied:
        _build(root, short, tmp)
    return tmp, short


def _build(root: str, rev: str, tmp: str) -> None:
    """Compile the C extensions of the extract ``tmp`` of ``rev`` in place with REV's setup.py (and the
    folders it names beside the package); a failure leaves REV's Python fallbacks to serve."""
    for extra in ("setup.py", "hooks"):
        arch = subprocess.run(["git", "-C", root, "archive", rev, extra], capture_output=True)
        if arch.returncode == 0:
            subprocess.run(["tar", "-x", "-C", tmp], input=arch.stdout, check=True)
    if os.path.isfile(os.path.join(tmp, "setup.py")):
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tmp,
                       capture_output=True)
        shutil.rmtree(os.path.join(tmp, "build"), ignore_errors=True)


def _same(a: str, b: str) -> bool:
    try:
        with open(a, "rb") as f, open(b, "rb") as g:
            return f.read() == g.read()
    except OSError:
        return False

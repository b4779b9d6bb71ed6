"""One generated section of docs/performance.md, shared by the benchmark scripts.

Each benchmark owns the text between its two markers (``<!-- NAME:start -->`` ... ``<!-- NAME:end -->``)
and rewrites only that, atomically; a missing section is appended, a missing file created.
Scripts import it as ``import docsection`` (they run with scripts/ on sys.path).
"""
from __future__ import annotations

import os

__all__ = ["markers", "write_section"]


def markers(name: str):
    """The (start, end) marker lines of section ``name``."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def write_section(path: str, name: str, section: str) -> None:
    """Replace section ``name`` of the Markdown file ``path`` with ``section`` (which carries the markers)."""
    start, end = markers(name)
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        text = "# Performance\n"
    section = section.rstrip("\n") + "\n"
    if start in text and end in text:
        a = text.index(start)
        b = text.index(end, a) + len(end)
        if text[b:b + 1] == "\n":
            b += 1
        text = text[:a] + section + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{name}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)

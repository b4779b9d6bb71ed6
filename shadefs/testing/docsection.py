"""The benchmarks' report writer: tables (plain text and Markdown) and the generated doc sections.

Each benchmark owns the text of docs/performance.md between its two markers (``<!-- NAME:start -->``
... ``<!-- NAME:end -->``) and rewrites only that, atomically; a missing section is appended, a missing
file created. ``from shadefs.testing import docsection`` (no sys.path edits).
"""
from __future__ import annotations

import json
import os

from typing import Any, Callable, List, Optional, Sequence

__all__ = ["markers", "write_section", "write_table_section", "saved_or_measured", "markdown_table", "Table"]


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


def write_table_section(path: str, name: str, title: str, intro: Sequence[str], table: str) -> None:
    """Replace section ``name`` of ``path`` (as :func:`write_section`) with a ``## title`` heading, the
    ``intro`` lines (the command, the regime, what each column means), a blank line and ``table``."""
    start, end = markers(name)
    write_section(path, name, "\n".join([start, f"## {title}", "", *intro, "", table, end]))


def saved_or_measured(results: Optional[str], save: Optional[str], measure: Callable[[], Any]) -> Any:
    """A benchmark's results: read from the JSON file ``results`` (a saved run, ``--results``) where given,
    else ``measure()``'s, written to ``save`` (``--json``) where given. Raises OSError or ValueError where
    ``results`` cannot be read or parsed."""
    if results:
        with open(results) as f:
            return json.load(f)
    out = measure()
    if save:
        with open(save, "w") as f:
            json.dump(out, f, indent=1)
    return out


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]],
                   align: Optional[str] = None) -> str:
    """A GitHub-Markdown table. ``align``: one letter per column, ``l`` (``---``) or ``r`` (``--:``);
    default every column ``---``. Cells are ``str()``-ed as they are; raises ValueError if a row or
    ``align`` has a different number of columns than ``headers``."""
    n = len(headers)
    align = align or "l" * n
    if len(align) != n or any(len(r) != n for r in rows):
        raise ValueError(f"markdown_table: {n} headers, align {align!r}, row widths {[len(r) for r in rows]}")
    lines = ["| " + " | ".join(str(h) for h in headers) + " |",
             "|" + "|".join("--:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


class Table:
    """A titled table printed on the console (:meth:`text`, first column left-aligned, the others
    right-aligned) and written into a doc section (:meth:`markdown`, under a ``####`` title)."""

    def __init__(self, title: str, headers: List[str], rows: List[List[str]], note: str = ""):
        self.title, self.headers, self.rows, self.note = title, headers, rows, note

    def text(self) -> str:
        widths = [max(len(str(x)) for x in col) for col in zip(self.headers, *self.rows)]

        def fmt(row):
            return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                             for i, (c, w) in enumerate(zip(row, widths)))

        lines = [self.title, fmt(self.headers), "  ".join("-" * w for w in widths)]
        lines += [fmt(r) for r in self.rows]
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = [f"#### {self.title}", "",
                 markdown_table(self.headers, self.rows, "l" + "r" * (len(self.headers) - 1))]
        if self.note:
            lines += ["", self.note]
        return "\n".join(lines)

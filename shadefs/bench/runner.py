"""The benchmarks' runner: one argument parser, load, regime line, interleaved rounds, baseline and doc writer.

Every benchmark is a module of :mod:`shadefs.bench` (or a package, its ``__init__`` the module; its
other modules the benchmark's parts) with a docstring (its first paragraph: the question it
answers; then the regime it runs in and the physical limit it is measured against), ``COMMON`` (which of
the common options it honours), ``add_arguments(parser)`` (its own options) and ``run(args, bench)``
(returns an exit status, None for 0). :func:`main` parses the common options (:func:`add_common`) and the
benchmark's, prints the load average at the start and the end,
and hands ``run`` a :class:`Bench` with the shared pieces:

- :meth:`Bench.regime`: :func:`shadefs.testing.regime.describe`'s line, printed and kept;
- :meth:`Bench.interleaved`: the rounds, each running every case, the order rotated by one every round so
  that load which comes and goes on a shared machine hits every case alike, each case in each position;
- :meth:`Bench.sides` / :meth:`Bench.baseline`: the working tree and, with ``--baseline REV``, the package of
  git revision REV beside it (:func:`shadefs.testing.baseline.extract`, its compiled parts built), each with
  the environment (``PYTHONPATH``) that runs a child process over it;
- :meth:`Bench.table`, :meth:`Bench.load`: a table printed with the load average it was measured at;
- :meth:`Bench.write_results`: with ``--write-doc``, the benchmark's section
  of docs/results/NAME.md and of docs/performance.md (:mod:`shadefs.testing.docsection`);
- :meth:`Bench.save_json`: with ``--json PATH``, the figures as JSON;
- :meth:`Bench.mount_variants` / :func:`add_variant_option`: the tree, the baseline and ``--variant`` mounts;
- :func:`env_with` (a child's environment with a daemon's switches), :func:`example` (the module of an
  example in scripts/ that a benchmark borrows from), :func:`median`, :func:`loadavg`.

``python -m shadefs.bench --list`` lists the benchmarks; ``python -m shadefs.bench NAME --help`` their options.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import shlex
import shutil
import statistics
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from shadefs.testing import Mount, baseline as _baseline, docsection
from shadefs.testing.regime import describe

__all__ = ["ROOT", "DOCS", "Bench", "Side", "add_common", "add_variant_option", "benchmarks", "question", "main",
           "median", "loadavg", "env_with", "example", "source_of"]

#: the checkout this package runs from (its docs/ and git history: the baseline is a revision of it)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: the docs folder of that checkout
DOCS = os.path.join(ROOT, "docs")
_NOT_BENCHMARKS = {"runner", "__main__"}


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages now, as ``"0.52 0.61 0.70"``."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def env_with(base: Optional[Dict[str, str]] = None, **overrides: str) -> Dict[str, str]:
    """A child's environment: ``base`` (default this process's) with ``overrides`` set (a daemon's switches
    such as ``SHADEFS_FUSE_PYTHON_LOOP="0"``; docs/configuration.md, "Environment")."""
    return {**(os.environ if base is None else base), **overrides}


def example(name: str):
    """The module of the example ``scripts/NAME.py`` (``make_fashion_mnist``, ``train_fashion_mnist``: what a
    user runs, which some benchmarks drive or borrow from), loaded from its file once. Raises OSError where
    the checkout has no such script."""
    import importlib.util

    key = f"shadefs_example_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, os.path.join(ROOT, "scripts", f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules[key] = mod
    return sys.modules[key]


def median(xs: Sequence[float]) -> float:
    """The median of ``xs``; NaN for none."""
    return statistics.median(xs) if xs else float("nan")


def benchmarks() -> List[str]:
    """The names of the benchmarks (the modules and packages of :mod:`shadefs.bench` but the runner), sorted."""
    here = os.path.dirname(os.path.abspath(__file__))
    return sorted(m.name for m in pkgutil.iter_modules([here]) if m.name not in _NOT_BENCHMARKS)


def source_of(name: str) -> str:
    """The file that holds benchmark ``name``'s docstring: ``NAME.py``, or ``NAME/__init__.py`` for a
    benchmark that is a package (one that it splits into parts)."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    return os.path.join(here, "__init__.py") if os.path.isdir(here) else here + ".py"


def question(name: str) -> str:
    """The first paragraph of benchmark ``name``'s docstring, on one line: the question it answers (read
    from the source, nothing imported). Raises OSError for an unknown name."""
    import ast

    with open(source_of(name), encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


class Side:
    """One package under test: the working tree (``path`` None) or a baseline revision's extract at ``path``.

    ``env`` is this process's environment with ``PYTHONPATH`` naming the side's package: a child process
    (a daemon, a reader, this benchmark's own child) started with it imports that side's ``shadefs``.
    ``cpus`` (a ``taskset -c`` list, or None) pins the daemons :meth:`mount` starts.
    """

    def __init__(self, name: str, path: Optional[str], cpus: Optional[str] = None):
        self.name, self.path, self.cpus = name, path, cpus
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(
            [path or ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        # ``python -m shadefs`` puts the working directory first on sys.path, before PYTHONPATH: run from a
        # checkout, a baseline's daemon would import the checkout's package. PYTHONSAFEPATH (3.11+) keeps the
        # working directory off sys.path, so each side's children import the package PYTHONPATH names
        self.env["PYTHONSAFEPATH"] = "1"

    @property
    def is_tree(self) -> bool:
        return self.path is None

    def mount(self, source: str, mountpoint: str, args: Sequence[str] = (), **kw: Any) -> Mount:
        """A started :class:`~shadefs.testing.Mount` of ``source`` at ``mountpoint`` by this side's daemon
        (``kw`` as Mount takes them; raises what :meth:`Mount.start` raises)."""
        m = Mount(source, mountpoint, list(args), env=self.env, **kw).start()
        if self.cpus:
            import subprocess

            subprocess.run(["taskset", "-a", "-p", "-c", self.cpus, str(m.pid)], check=True, capture_output=True)
        return m

    def __repr__(self) -> str:
        return f"Side({self.name!r})"


class Bench:
    """What :func:`main` hands a benchmark's ``run``: its name, parsed options and the shared helpers.

    Attributes: ``name``, ``args`` (the parsed options), ``argv`` (the options as given), ``load_start``
    (``os.getloadavg()`` when the run began), ``regime_line`` (the last :meth:`regime`; "" before).
    """

    def __init__(self, name: str, args: argparse.Namespace, argv: Sequence[str] = ()):
        self.name, self.args, self.argv = name, args, list(argv)
        self.load_start = os.getloadavg()
        self.regime_line = ""
        self.tables: List[docsection.Table] = []
        self._baseline: Optional[Tuple[str, str]] = None
        self._cleanups: List[Callable[[], None]] = []

    # -- what a run prints: the command, the load, the regime, tables
    @property
    def command(self) -> str:
        """The command line that reproduces this run (for a doc section)."""
        return " ".join(["python -m shadefs.bench", self.name, *map(shlex.quote, self.argv)])

    def load(self) -> str:
        """``"load average START at the start, NOW now"`` (1-minute figures; the 5 and 15 minute ones now)."""
        return f"load average {self.load_start[0]:.2f} at the start, {loadavg()} now"

    def regime(self, regime: str, limit_bytes: int = 0, dataset_bytes: int = 0) -> str:
        """Print and keep :func:`shadefs.testing.regime.describe`'s line (same arguments, same ValueError)."""
        self.regime_line = describe(regime, limit_bytes=limit_bytes, dataset_bytes=dataset_bytes)
        print(self.regime_line, flush=True)
        return self.regime_line

    def table(self, title: str, headers: List[str], rows: List[List[Any]], note: str = "") -> docsection.Table:
        """Print a table (:class:`~shadefs.testing.docsection.Table`) followed by the load average, and keep
        it for :meth:`markdown_tables`."""
        t = docsection.Table(title, headers, [[str(c) for c in r] for r in rows], note)
        print(t.text())
        print(self.load(), flush=True)
        self.tables.append(t)
        return t

    def markdown_tables(self) -> str:
        """The tables printed so far, as Markdown, one after the other."""
        return "\n\n".join(t.markdown() for t in self.tables)

    def error(self, message: str) -> None:
        """Stop the run on a bad option (as argparse does: the message on stderr, exit status 2)."""
        print(f"python -m shadefs.bench {self.name}: error: {message}", file=sys.stderr)
        raise SystemExit(2)

    def progress(self, message: str) -> None:
        """A progress line on stderr, with the load average now."""
        print(f"{self.name}: {message} (load {loadavg()})", file=sys.stderr, flush=True)

    # -- rounds
    def interleaved(self, cases: Sequence[Any], rounds: Optional[int] = None) -> Iterator[Tuple[int, Any]]:
        """``(round, case)`` for every case of every round (``--rounds`` by default); round ``r`` takes the
        cases rotated by ``r`` (``[a, b, c]``, ``[b, c, a]``, ``[c, a, b]``, ...), so over as many rounds as
        cases each case runs once in each position: a case that runs better first, last or right after
        itself (as at the turn of reversed rounds) is not favoured. A progress line with the load ends
        every round."""
        n = self.args.rounds if rounds is None else rounds
        cases = list(cases)
        for r in range(n):
            k = r % len(cases) if cases else 0
            for case in cases[k:] + cases[:k]:
                yield r, case
            self.progress(f"round {r + 1}/{n} done")

    # -- the baseline
    def baseline(self) -> Optional[Tuple[str, str]]:
        """``(directory, short hash)`` of ``--baseline REV``'s package (extracted once, its compiled parts
        built, removed when the run ends), or None without ``--baseline`` (or ``--baseline none``).

        Raises SystemExit with git's message when REV is not a revision of this checkout."""
        rev = getattr(self.args, "baseline", None)
        if not rev or rev == "none":
            return None
        if self._baseline is None:
            import subprocess

            try:
                self._baseline = _baseline.extract(ROOT, rev, prefix=f"shadefs-bench-{self.name}-baseline-",
                                                   build=True)
            except subprocess.CalledProcessError as e:
                err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
                raise SystemExit(f"--baseline {rev}: {err.strip()}")
            path = self._baseline[0]
            self._cleanups.append(lambda: shutil.rmtree(path, ignore_errors=True))
        return self._baseline

    def sides(self, cpus: Optional[str] = None, tree: str = "tree") -> List[Side]:
        """The working tree's :class:`Side` (named ``tree``) and, with ``--baseline REV``, REV's (named
        ``REV@HASH``)."""
        out = [Side(tree, None, cpus)]
        b = self.baseline()
        if b:
            out.append(Side(f"{self.args.baseline}@{b[1]}", b[0], cpus))
        return out

    def mount_variants(self, tree: str = "shadefs") -> Dict[str, Tuple[Optional[dict], List[str]]]:
        """``label -> (env, extra mount arguments)`` of the mounts to compare: the working tree (``tree``, env
        None: this process's), ``--baseline``'s package (``"TREE HASH"``) and each ``--variant LABEL=ARGS``
        (:func:`add_variant_option`: the tree mounted with ARGS too, ``"TREE LABEL"``)."""
        out: Dict[str, Tuple[Optional[dict], List[str]]] = {tree: (None, [])}
        b = self.baseline()
        if b:
            out[f"{tree} {b[1]}"] = (dict(os.environ, PYTHONPATH=b[0]), [])
        for v in getattr(self.args, "variant", None) or []:
            label, _, vargs = v.partition("=")
            out[f"{tree} {label}"] = (None, vargs.split())
        return out

    def on_close(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` when the run ends (last registered, first called), whatever happened."""
        self._cleanups.append(fn)

    def close(self) -> None:
        while self._cleanups:
            try:
                self._cleanups.pop()()
            except Exception as e:  # a clean-up that fails must not hide the run's own outcome
                print(f"{self.name}: clean-up failed: {e}", file=sys.stderr)

    # -- output files
    def results_path(self) -> str:
        """docs/results/NAME.md: the benchmark's long report."""
        return os.path.join(DOCS, "results", f"{self.name}.md")

    def write_results(self, section: str, marker: Optional[str] = None, path: Optional[str] = None) -> bool:
        """With ``--write-doc``: replace section ``marker`` (default NAME) of ``path`` (default
        :meth:`results_path`) with ``section`` (which carries the markers: :func:`docsection.markers`).
        Returns whether it wrote."""
        if not self.args.write_doc:
            return False
        path = path or self.results_path()
        if not os.path.exists(path):  # a new report: its title names the command
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                f.write(f"# Results of `python -m shadefs.bench {self.name}`\n")
        docsection.write_section(path, marker or self.name, section)
        print(f"{self.name}: wrote {os.path.relpath(path, ROOT)}", file=sys.stderr)
        return True

    def save_json(self, obj: Any) -> None:
        """With ``--json PATH``: write ``obj`` there (atomically)."""
        if self.args.json:
            tmp = self.args.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump(obj, f, indent=1)
            os.replace(tmp, self.args.json)


#: the common options: name -> (flag, add_argument keywords)
_COMMON = {
    "rounds": ("--rounds", dict(type=int, default=1, help="interleaved rounds (every case once per round; "
                                "figures are medians over rounds, or the best where the benchmark says so)")),
    "baseline": ("--baseline", dict(metavar="REV", default=None, help="also run the shadefs package of git "
                                    "revision REV side by side ('none': the tree alone)")),
    "write_doc": ("--write-doc", dict(action="store_true", help="rewrite this benchmark's section of "
                                      "docs/results/NAME.md (and of docs/performance.md where it keeps one)")),
    "json": ("--json", dict(metavar="PATH", default=None, help="also write the figures to PATH as JSON")),
}


def add_common(p: argparse.ArgumentParser, names: Sequence[str] = tuple(_COMMON)) -> None:
    """The common options ``names`` (of ``rounds``, ``baseline``, ``write_doc``, ``json``: those a benchmark
    honours, its module's ``COMMON``); the others stay at their defaults, and a command line that gives one is
    refused. A benchmark changes their defaults with ``p.set_defaults``."""
    g = p.add_argument_group("common options")
    for name, (flag, kw) in _COMMON.items():
        if name in names:
            g.add_argument(flag, **kw)
    p.set_defaults(**{name: kw.get("default", False) for name, (_, kw) in _COMMON.items() if name not in names})


def add_variant_option(p: argparse.ArgumentParser, example: str) -> None:
    """``--variant LABEL=ARGS`` (repeatable): also mount the working tree with these mount arguments
    (:meth:`Bench.mount_variants`). ``example``: one for the help, e.g. ``"daemon=--source-passthrough off"``."""
    p.add_argument("--variant", action="append", default=[], metavar="LABEL=ARGS",
                   help="also mount this tree with these mount arguments (space-separated), shown as "
                        f"'shadefs LABEL' (repeatable; e.g. '{example}')")


def parser_for(name: str) -> Tuple[argparse.ArgumentParser, Any]:
    """The argument parser of benchmark ``name`` (common options and its own) and its module."""
    mod = importlib.import_module(f"shadefs.bench.{name}")
    p = argparse.ArgumentParser(prog=f"python -m shadefs.bench {name}", description=mod.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p, getattr(mod, "COMMON", tuple(_COMMON)))
    mod.add_arguments(p)
    return p, mod


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m shadefs.bench NAME [options]`` / ``--list``. Returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    names = benchmarks()
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m shadefs.bench NAME [options] | --list\n\n"
              "Runs benchmark NAME (python -m shadefs.bench NAME --help: its options).\n"
              f"benchmarks: {', '.join(names)}")
        return 0 if argv else 2
    if argv[0] == "--list":
        width = max(map(len, names))
        for n in names:
            print(f"{n.ljust(width)}  {question(n)}")
        return 0
    name, rest = argv[0].replace("-", "_"), argv[1:]
    if name not in names:
        print(f"unknown benchmark {argv[0]!r}; one of: {', '.join(names)}", file=sys.stderr)
        return 2
    p, mod = parser_for(name)
    args = p.parse_args(rest)
    bench = Bench(name, args, rest)
    print(f"{bench.command}\nload average at the start: {loadavg()}, {os.cpu_count()} CPUs", flush=True)
    try:
        rc = mod.run(args, bench)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        rc = 130
    finally:
        bench.close()
        print(f"load average at the end: {loadavg()}", flush=True)
    return int(rc or 0)

"""The package's import graph: the ``shadefs`` command sits on top (nothing imports :mod:`shadefs.cli` but
``python -m shadefs``), and no two modules import each other, directly or around a circle.

Read statically from the sources (every ``import``, at module level or inside a function: a lazy import
that closes a circle is still a circle, it only fails later and elsewhere)."""
import ast
import functools
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# where each top-level package's sources are (setup.py's package_dir)
PACKAGES = {"shadefs": os.path.join(ROOT, "shadefs"), "shadefs.hooks": os.path.join(ROOT, "hooks")}


def modules() -> dict:
    """``{dotted module name: source path}`` of every module of the package."""
    out = {}
    for pkg, base in PACKAGES.items():
        for dirpath, dirnames, files in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), base)[:-3].split(os.sep)
                    if rel[-1] == "__init__":
                        rel = rel[:-1]
                    out[".".join([pkg] + rel)] = os.path.join(dirpath, f)
    return out


def imports(name: str, path: str, known: dict) -> set:
    """The package's modules that module ``name`` imports anywhere in its source."""
    pkg = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` imports mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


@functools.lru_cache(maxsize=None)
def graph() -> dict:
    mods = modules()
    g = {}
    for name, path in mods.items():
        deps = imports(name, path, mods)
        # a registry's lazy lookup of its own package (shadefs.policies.base.get_policy makes sure the
        # package, which imports every policy, has run) is how a package registers its members, not a circle
        g[name] = {d for d in deps if not name.startswith(d + ".")}
    return g


def cycles(g: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def in_cli(module: str) -> bool:
    """``module`` is the ``shadefs`` command's package or one of its modules."""
    return module == "shadefs.cli" or module.startswith("shadefs.cli.")


def test_the_graph_is_read_from_every_module():
    g = graph()
    assert {"shadefs.cli", "shadefs.warm", "shadefs.fuse.libfuse", "shadefs.fuse.kernel",
            "shadefs.cache.core", "shadefs.hooks"} <= set(g)
    assert "shadefs.cache.core" in g["shadefs.plan.prefetch"]        # a module-level relative import
    assert "shadefs.warm" in g["shadefs.cli.parser"]                 # an import inside a function


def test_nothing_imports_the_cli():
    g = graph()
    importers = sorted(m for m, deps in g.items() if not in_cli(m) and any(in_cli(d) for d in deps))
    assert importers == ["shadefs.entry"], importers   # the console script and python -m shadefs


@pytest.mark.parametrize("module", ["shadefs.warm", "shadefs.fuse", "shadefs.fuse.libfuse", "shadefs.fuse.libfuse_ops",
                                    "shadefs.fuse.kernel", "shadefs.daemon"])
def test_what_the_cli_runs_does_not_import_it_back(module):
    g = graph()
    seen, todo = set(), [module]
    while todo:  # everything ``module`` imports, transitively
        m = todo.pop()
        for d in g[m]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    assert not any(in_cli(m) for m in seen)


def test_no_import_circle():
    assert cycles(graph()) == []

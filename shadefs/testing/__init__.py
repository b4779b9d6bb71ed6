"""Shared harness of the tests and the benchmark scripts (no sys.path edits needed).

- :mod:`shadefs.testing.mounts`: :class:`Mount` (a real mount through the CLI; waits for the daemon,
  unmounts and waits for it to exit), :func:`unmount`, :func:`wait_for`, :func:`pid_alive`,
  :func:`tracebacks` (what the test fixture checks every daemon log for); a process's measures:
  :func:`proc_cpu_s`, :func:`proc_vm`, :func:`ctx_switches`, :func:`strace_counts`.
- :mod:`shadefs.testing.s3`: :class:`MotoServer` (``python -m moto.server`` as a process) and
  :class:`LatencyProxyProcess` (:mod:`shadefs.testing.latency_proxy` in front of it), dummy AWS settings.
- :mod:`shadefs.testing.s3data`: :func:`~shadefs.testing.s3data.upload` (a tree into a bucket), :class:`~shadefs.testing.s3data.S3ImageFolder` (the reader without shadefs: one GET per sample), :func:`~shadefs.testing.s3data.probe` (GET latency).
- :mod:`shadefs.testing.docsection`: the tables and the generated sections of docs/performance.md and docs/results/, and :func:`~shadefs.testing.docsection.saved_or_measured` (``--results`` / ``--json``).
- :mod:`shadefs.testing.baseline`: :func:`~shadefs.testing.baseline.extract` (a git revision of the package beside the tree, for side-by-side benchmarks).
- :mod:`shadefs.testing.handles`: :func:`~shadefs.testing.handles.open_read` (open, read whole, release, through a TieredCache), :func:`~shadefs.testing.handles.memory_handle` (a front end's Handle over bytes in memory).
- :mod:`shadefs.testing.gated`: :class:`~shadefs.testing.gated.GatedCache` (behind an in-process kernel front end: a FUSE source whose ``hang/`` opens block until a gate opens; hung backend reads on demand).
- :mod:`shadefs.testing.users`: :func:`~shadefs.testing.users.as_nobody` (run a function as uid/gid 65534 in a forked child; its errno back).
- :mod:`shadefs.testing.datasets`: :class:`~shadefs.testing.datasets.FileDataset` (ImageFolder-like `samples`; an item reads its file whole), :func:`~shadefs.testing.datasets.random_tree` (the read benchmarks' tree of random files, reused when unchanged), :func:`~shadefs.testing.datasets.random_file`, :func:`~shadefs.testing.datasets.completed_tree` / :func:`~shadefs.testing.datasets.mark_complete` (a generated tree's ``.complete`` summary).

Used by tests/conftest.py, the benchmarks (shadefs.bench) and scripts/demo.py; ships with the package (it needs the ``test``
extra only for the S3 pieces).
"""
from shadefs.testing.mounts import (
    Mount, ShadefsError, ctx_switches, force_unmount, pid_alive, proc_cpu_s, proc_vm, shadefs, strace_counts,
    tracebacks, unmount, wait_for, wait_pid_gone,
)

__all__ = ["Mount", "ShadefsError", "ctx_switches", "force_unmount", "pid_alive", "proc_cpu_s", "proc_vm", "shadefs",
           "strace_counts", "tracebacks", "unmount", "wait_for", "wait_pid_gone"]

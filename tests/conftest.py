"""Shared fixtures: real FUSE mounts started through the real CLI, a real S3 server process, small trees.

Every mount a test starts (the ``mount`` fixture, or :class:`Mount` directly) has its daemon log read
when the test ends: a ``Traceback`` in it fails the test, unless the test is marked
``@pytest.mark.expect_traceback`` or set ``m.expect_traceback = True`` on that mount.

Dependencies that ``make test`` installs are asked for with :func:`require`: missing, they skip a test
on a developer's machine, and fail it under ``CI=true``.
"""
from __future__ import annotations

import importlib
import os
import shutil

import pytest

from shadefs.cli import is_mounted  # noqa: F401  (tests import it from here)
from shadefs.testing import mounts as _mounts
from shadefs.testing.mounts import SHADEFS, ShadefsError  # noqa: F401
from shadefs.testing.s3 import AWS_ENV_DROP, DUMMY_AWS_ENV, MotoServer

CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")

#: the FUSE front ends a test marked ``both_frontends`` runs against (``--fuse-impl``)
FRONTENDS = ("kernel", "libfuse")
# every reply the kernel front end writes to /dev/fuse is checked against its opcode's layout: a bad one
# is logged as "FUSE reply check failed" with a traceback, which fails the test (_daemon_tracebacks)
os.environ.setdefault("SHADEFS_FUSE_CHECK_REPLIES", "1")


SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


def load_script(name: str):
    """The module of ``scripts/<name>.py``, loaded from its file (the scripts are not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pytest_configure(config):
    config.addinivalue_line("markers", "both_frontends: run each test that mounts once per FUSE front end")


#: the tier of each test folder: ``unit`` tests mount nothing (the quick
#: ones under a second each: ``make test-fast`` runs ``unit and not slow``), ``mount`` tests start real
#: FUSE mounts and servers; e2e tests train through a mount, and are ``slow`` as well
_TIERS = {"unit": ("unit",), "integration": ("mount",), "e2e": ("mount", "slow")}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in _TIERS.get(item.path.parent.name, ()):
            item.add_marker(name)


def pytest_generate_tests(metafunc):
    """Tests marked ``both_frontends`` that mount run once per front end (``[kernel]``, ``[libfuse]``);
    elsewhere ``SHADEFS_TEST_FUSE_IMPL=libfuse`` (or ``kernel``) picks the front end of every mount."""
    if "fuse_impl" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_frontends"):
        metafunc.parametrize("fuse_impl", FRONTENDS, indirect=True)


@pytest.fixture
def fuse_impl(request):
    """The ``--fuse-impl`` of this test's mounts, or None for the CLI's default."""
    return getattr(request, "param", None) or os.environ.get("SHADEFS_TEST_FUSE_IMPL") or None


def _missing(name: str):
    """None if ``name`` is present, else why not. A device (``/dev/fuse``) must open read-write, another
    path must exist; a name with a dot or in _MODULES is a Python module; anything else is a program on
    PATH."""
    if name.startswith("/dev/"):
        try:
            os.close(os.open(name, os.O_RDWR))
            return None
        except OSError as e:
            return f"{name} ({e.strerror})"
    if name.startswith("/"):
        return None if os.path.exists(name) else f"{name} (missing)"
    if "." in name or name in _MODULES:
        try:
            return importlib.import_module(name) and None
        except Exception as e:  # an ImportError, or a broken install raising something else
            return f"Python module {name} ({type(e).__name__}: {e})"
    return None if shutil.which(name) else f"program {name} (not on PATH)"


_MODULES = {"moto", "s3fs", "boto3", "botocore", "torch", "torchvision", "redis", "xxhash", "aiohttp", "fsspec", "PIL"}


def require(*names: str):
    """Ask for what ``make test`` installs: Python modules (``"moto.server"``, ``"torch"``), programs
    (``"fusermount3"``, ``"redis-server"``) or devices (``"/dev/fuse"``).

    All present: returns the module (one module name) or None. Something missing: ``pytest.skip``
    on a developer's machine, ``pytest.fail`` under ``CI=true`` (a broken install must not turn a
    suite into green skips). Works at module level and inside tests and fixtures."""
    missing = [why for why in map(_missing, names) if why]
    if missing:
        msg = "needs " + ", ".join(missing)
        if CI:
            pytest.fail(f"{msg}; CI=true: make test installs it, so this is a failure, not a skip",
                        pytrace=False)
        pytest.skip(msg, allow_module_level=True)
    if len(names) == 1 and not names[0].startswith("/") and ("." in names[0] or names[0] in _MODULES):
        return importlib.import_module(names[0])
    return None


FUSE = ("/dev/fuse", "fusermount3")


def require_fuse() -> None:
    """A usable /dev/fuse and fusermount3 (see :func:`require`)."""
    require(*FUSE)


def run_cli(*args, check=True, timeout=60, env=None):
    """Run ``shadefs ARGS`` in a subprocess; returns CompletedProcess (text); AssertionError if it fails
    and ``check``."""
    try:
        return _mounts.shadefs(*args, check=check, timeout=timeout, env=env)
    except ShadefsError as e:
        raise AssertionError(str(e)) from None


# -- every Mount made during a test is checked for tracebacks when the test ends ---------------------------
_started: list = []


class Mount(_mounts.Mount):
    """A running shadefs mount (see shadefs.testing.Mount) whose daemon log the test's teardown checks.

    ``expect_traceback = True`` on an instance: a traceback in its log does not fail the test."""

    expect_traceback = False

    def __init__(self, source, mountpoint, args=(), log_file=None, fuse_impl=None, **kwargs):
        self.fuse_impl = fuse_impl
        super().__init__(source, mountpoint, self._with_impl(args), log_file, **kwargs)
        _started.append(self)  # in __init__: subclasses with their own start() are checked too

    def _with_impl(self, args):
        return (["--fuse-impl", self.fuse_impl] if self.fuse_impl else []) + [str(a) for a in args]

    def start(self, *args):
        return super().start(*self._with_impl(args)) if args else super().start()

    def umount(self, exit_timeout: float = 30.0, log=None):
        return super().umount(exit_timeout=exit_timeout, log=log)


@pytest.fixture(autouse=True)
def _daemon_tracebacks(request):
    """Teardown (after every other fixture's, so after the mounts are gone): fail the test if a daemon
    it mounted logged a traceback it did not declare expected."""
    del _started[:]
    yield
    mounts, expected = list(_started), request.node.get_closest_marker("expect_traceback") is not None
    del _started[:]
    found = []
    for m in mounts:
        if m.mounted():  # a test that started a Mount by hand and left it behind
            m.umount()
        if not (expected or m.expect_traceback):
            found += [f"--- {m.log_file} (mount {m.path}):\n{tb}" for tb in m.tracebacks()]
    if found:
        pytest.fail("the shadefs daemon logged a traceback (mark the test expect_traceback if it is "
                    "expected):\n" + "\n".join(found), pytrace=False)


@pytest.fixture
def fuse():
    """Skip (fail under CI=true) without a usable /dev/fuse and fusermount3."""
    require_fuse()


@pytest.fixture
def mount(tmp_path, fuse, fuse_impl):
    """Factory: ``mount(source, *cli_args, name=None) -> Mount``; every mount is unmounted at teardown
    (its daemon waited for), and the test fails if its daemon logged a traceback it did not expect.
    The front end is ``fuse_impl`` (one run per front end for tests marked ``both_frontends``)."""
    mounts = []

    def _mount(source, *args, name=None, env=None):
        mp = tmp_path / (name or f"mnt{len(mounts)}")
        mp.mkdir()
        m = Mount(source, mp, args, tmp_path / f"{mp.name}.log", env=env, fuse_impl=fuse_impl)
        mounts.append(m)
        return m.start()

    yield _mount
    for m in mounts:
        m.umount()
    left = [m.path for m in mounts if is_mounted(m.path)]
    for path in left:
        _mounts.force_unmount(path)
    assert not left, f"still mounted after unmount: {left}"


def make_tree(root, spec):
    """Create files under ``root`` from ``{relpath: bytes}``; returns root."""
    for rel, data in spec.items():
        p = os.path.join(str(root), rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    return root


@pytest.fixture
def small_tree(tmp_path):
    """Ten files of 1000..10000 bytes in two class folders, deterministic content."""
    import random

    rng = random.Random(7)
    spec = {}
    for i in range(10):
        spec[f"{'cat' if i % 2 else 'dog'}/{i:02d}.bin"] = bytes(rng.getrandbits(8) for _ in range(1000 * (i + 1)))
    src = tmp_path / "src"
    make_tree(src, spec)
    return src, spec


@pytest.fixture
def cli():
    """``cli(*args, check=True)``: run the real ``shadefs`` command."""
    return run_cli


def set_dummy_aws_env(mp) -> None:
    """Dummy S3 credentials for this test process only: no shared config, no proxy, no instance metadata.

    ``mp`` is a ``pytest.MonkeyPatch`` (undone when its context ends)."""
    for name in AWS_ENV_DROP:
        mp.delenv(name, raising=False)
    for name, value in DUMMY_AWS_ENV.items():
        mp.setenv(name, value)


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory):
    """One ``python -m moto.server`` process on a free loopback port for the whole session (a
    :class:`shadefs.testing.s3.MotoServer`: ``.endpoint``, ``.port``, ``.client()``). Tests use their
    own bucket names; the dummy AWS environment is set for the session."""
    require("moto.server", "boto3", "s3fs")
    with pytest.MonkeyPatch.context() as mp:
        set_dummy_aws_env(mp)
        server = MotoServer(log_file=str(tmp_path_factory.mktemp("moto") / "moto.log")).start()
        try:
            yield server
        finally:
            server.stop()

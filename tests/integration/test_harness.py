"""The test harness itself: a daemon traceback fails a mount test, CI=true turns a missing dependency
into a failure, the per-test timeout ends a hang, and shadefs.testing's pieces behave as documented."""
import os
import subprocess
import sys
import textwrap

import pytest

from shadefs.testing import Mount, tracebacks, unmount
from shadefs.testing.docsection import Table, markdown_table, write_section

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TB = "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nValueError: boom\n"


def run_inner(tmp_path, body, *args, ci=None):
    """Run a generated test file with this suite's conftest and pytest.ini in a child pytest; returns
    (exit status, output)."""
    d = tmp_path / "inner"
    d.mkdir()
    with open(os.path.join(TESTS, "conftest.py")) as f:
        (d / "conftest.py").write_text(f.read())
    with open(os.path.join(os.path.dirname(TESTS), "pytest.ini")) as f:
        (d / "pytest.ini").write_text(f.read().replace("testpaths = tests", "testpaths = ."))
    (d / "test_inner.py").write_text(textwrap.dedent(body))
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *args],
                       cwd=d, env=env, capture_output=True, text=True, timeout=240)
    return r.returncode, r.stdout + r.stderr


@pytest.mark.usefixtures("fuse")
def test_a_daemon_traceback_fails_the_test_unless_declared_expected(tmp_path):
    rc, out = run_inner(tmp_path, f'''
        import pytest
        TB = {TB!r}

        def test_clean(small_tree, mount):
            m = mount(small_tree[0])
            assert m.tracebacks() == []

        def test_traceback(small_tree, mount):
            m = mount(small_tree[0])
            with open(m.log_file, "a") as f:
                f.write(TB)

        @pytest.mark.expect_traceback
        def test_marked(small_tree, mount):
            m = mount(small_tree[0])
            with open(m.log_file, "a") as f:
                f.write(TB)

        def test_attribute(small_tree, mount):
            m = mount(small_tree[0])
            m.expect_traceback = True
            with open(m.log_file, "a") as f:
                f.write(TB)
    ''')
    assert rc == 1, out
    assert "4 passed, 1 error" in out, out
    assert "ERROR test_inner.py::test_traceback - Failed: the shadefs daemon" in out, out  # a red run
    assert "ERROR at teardown of test_traceback" in out and out.count("ERROR at teardown") == 1, out
    assert "ValueError: boom" in out


@pytest.mark.parametrize("ci, outcome", [(None, "1 skipped"), ("true", "1 failed")])
def test_a_missing_dependency_skips_locally_and_fails_under_ci(tmp_path, ci, outcome):
    rc, out = run_inner(tmp_path, '''
        from conftest import require

        def test_needs_it():
            require("shadefs_no_such_module.x", "/dev/shadefs-no-such-device", "shadefs-no-such-program")
    ''', ci=ci)
    assert (rc == 0) == (ci is None), out
    assert outcome in out, out
    assert ("needs Python module shadefs_no_such_module.x (ModuleNotFoundError: No module named "
            "'shadefs_no_such_module'), /dev/shadefs-no-such-device (No such file or directory), "
            "program shadefs-no-such-program (not on PATH)") in out, out


def test_the_configured_timeout_ends_a_hang(tmp_path):
    rc, out = run_inner(tmp_path, '''
        import threading

        def test_hangs():
            threading.Event().wait()  # forever
    ''', "-o", "timeout=2")
    assert rc != 0 and "Timeout" in out, out


def test_tracebacks_cuts_each_block_at_its_exception_line():
    text = "INFO a\n" + TB + "INFO b\n" + TB.replace("boom", "again")
    assert tracebacks(text) == [TB.rstrip("\n"), TB.rstrip("\n").replace("boom", "again")]
    assert tracebacks("INFO no traceback here\n") == []


@pytest.mark.usefixtures("fuse")
def test_mount_context_manager_waits_for_the_daemon_and_unmounts(small_tree, tmp_path):
    from shadefs.cli import is_mounted
    from shadefs.testing import pid_alive

    src, spec = small_tree
    with Mount(src, tmp_path / "m", ["--ram-cache", "1MiB"], log_file=tmp_path / "m.log") as m:
        assert is_mounted(m.path) and pid_alive(m.pid)
        with open(os.path.join(m.path, "dog/00.bin"), "rb") as f:
            assert f.read() == spec["dog/00.bin"]
        assert m.stats()["opens"] == 1
    assert not is_mounted(m.path) and not pid_alive(m.pid)
    assert unmount(m.path, m.pid) is None  # idempotent: nothing left to do
    assert m.tracebacks() == []


def test_table_writers(tmp_path):
    assert markdown_table(["a", "b"], [[1, 2]], "lr") == "| a | b |\n|---|--:|\n| 1 | 2 |"
    with pytest.raises(ValueError):
        markdown_table(["a", "b"], [[1]])
    t = Table("T", ["name", "n"], [["x", "10"], ["yy", "2"]], note="note")
    assert t.text() == "T\nname   n\n----  --\nx     10\nyy     2\nnote"
    assert t.markdown() == "#### T\n\n| name | n |\n|---|--:|\n| x | 10 |\n| yy | 2 |\n\nnote"
    doc = tmp_path / "perf.md"
    doc.write_text("# P\n\n<!-- s:start -->\nold\n<!-- s:end -->\ntail\n")
    write_section(str(doc), "s", "<!-- s:start -->\nnew\n<!-- s:end -->")
    write_section(str(doc), "t", "<!-- t:start -->\nT\n<!-- t:end -->")
    assert doc.read_text() == ("# P\n\n<!-- s:start -->\nnew\n<!-- s:end -->\ntail\n\n"
                               "<!-- t:start -->\nT\n<!-- t:end -->\n")

"""The benchmarks' runner (shadefs.bench.runner): the list, the common options, interleaved rounds, the
sides, the doc sections; in process."""
import argparse
import os

import pytest

from shadefs.bench import runner
from shadefs.testing import docsection


def _bench(tmp_path, **kw):
    args = argparse.Namespace(**{"rounds": 1, "baseline": None, "write_doc": False, "json": None, **kw})
    return runner.Bench("miss_cost", args, ["--files", "10"])


def test_the_list_names_every_benchmark_module_and_its_question(capsys):
    names = runner.benchmarks()
    assert {"miss_cost", "read", "hit_ratio", "epoch"} <= set(names)
    assert not {"runner", "__main__", "__init__"} & set(names)
    assert runner.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == names
    assert all(len(ln.split(None, 1)) == 2 for ln in lines)  # every benchmark states its question
    assert runner.question("miss_cost").startswith("What does a miss cost the daemon")


def test_a_benchmark_that_is_a_package_is_listed_once_with_its_question():
    # read, epoch and hit_ratio are packages of parts: the package is the benchmark, its parts are not
    names = runner.benchmarks()
    assert not {"rig", "sources", "measure", "report", "child", "configs", "analysis"} & set(names)
    assert runner.source_of("read") == os.path.join(os.path.dirname(runner.__file__), "read", "__init__.py")
    assert runner.source_of("miss_cost") == os.path.join(os.path.dirname(runner.__file__), "miss_cost.py")
    assert runner.question("read").startswith("Read-path throughput of a shadefs mount")
    assert runner.question("epoch").startswith("Epoch time of a DataLoader(ImageFolder")
    assert runner.question("hit_ratio").startswith("Cache hit ratio of real Fashion-MNIST training")
    p, mod = runner.parser_for("read")
    assert mod.COMMON == ("baseline", "write_doc", "json")
    assert p.parse_args(["--quick"]).quick


def test_no_file_of_a_benchmark_is_over_900_lines():
    here = os.path.dirname(runner.__file__)
    long = {}
    for d, _, files in os.walk(here):
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(d, f)) as fh:
                    n = sum(1 for _ in fh)
                if n > 900:
                    long[os.path.relpath(os.path.join(d, f), here)] = n
    assert long == {}  # split one along its seams into a package of parts (as read, epoch, hit_ratio are)


def test_an_unknown_benchmark_is_refused_with_the_list(capsys):
    assert runner.main(["no_such_bench"]) == 2
    assert "miss_cost" in capsys.readouterr().err


def test_a_benchmark_takes_the_common_options_it_honours():
    p, mod = runner.parser_for("miss_cost")
    assert mod.COMMON == ("rounds", "baseline", "json")
    a = p.parse_args(["--rounds", "2", "--baseline", "none", "--json", "out.json"])
    assert (a.rounds, a.baseline, a.write_doc, a.json) == (2, "none", False, "out.json")
    # a benchmark's own defaults for them
    assert (p.parse_args([]).rounds, p.parse_args([]).baseline) == (3, "main")


def test_a_common_option_a_benchmark_does_not_honour_is_refused(capsys):
    p, mod = runner.parser_for("restart")
    assert mod.COMMON == ()
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--baseline", "main"])
    assert e.value.code == 2
    assert "unrecognized arguments: --baseline main" in capsys.readouterr().err
    a = p.parse_args([])  # the helpers still find them, at their defaults
    assert (a.rounds, a.baseline, a.write_doc, a.json) == (1, None, False, None)


def test_interleaved_rounds_rotate_the_order_so_each_case_takes_each_position(tmp_path, capsys):
    b = _bench(tmp_path, rounds=3)
    assert list(b.interleaved(["a", "b", "c"])) == [(0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a"),
                                                    (2, "c"), (2, "a"), (2, "b")]
    assert capsys.readouterr().err.count("round ") == 3  # a progress line, with the load, per round
    assert list(b.interleaved(["a"], rounds=2)) == [(0, "a"), (1, "a")]


def test_without_a_baseline_the_only_side_is_the_tree(tmp_path):
    for rev in (None, "none"):
        b = _bench(tmp_path, baseline=rev)
        assert b.baseline() is None
        [side] = b.sides()
        assert side.name == "tree" and side.is_tree
        assert side.env["PYTHONPATH"].split(os.pathsep)[0] == runner.ROOT


def test_a_baseline_that_is_no_revision_stops_the_run_with_gits_word(tmp_path):
    b = _bench(tmp_path, baseline="no-such-revision-anywhere")
    with pytest.raises(SystemExit, match="^--baseline no-such-revision-anywhere: fatal: Needed a single revision$"):
        b.baseline()


def test_the_command_and_a_table_printed_with_the_load(tmp_path, capsys):
    b = _bench(tmp_path)
    assert b.command == "python -m shadefs.bench miss_cost --files 10"
    b.table("t", ["case", "us"], [["miss", 1]])
    out = capsys.readouterr().out
    assert out.splitlines()[:4] == ["t", "case  us", "----  --", "miss   1"]
    assert out.splitlines()[4].startswith("load average ")
    assert b.markdown_tables() == "#### t\n\n| case | us |\n|---|--:|\n| miss | 1 |"


def test_doc_sections_are_written_only_with_write_doc(tmp_path):
    doc = tmp_path / "r.md"
    start, end = docsection.markers("miss_cost")
    assert not _bench(tmp_path).write_results(f"{start}\nx\n{end}", path=str(doc))
    assert not doc.exists()
    b = _bench(tmp_path, write_doc=True)
    assert b.write_results(f"{start}\nx\n{end}", path=str(doc))
    assert b.write_results(f"{start}\ny\n{end}", path=str(doc))  # replaces its own section
    assert doc.read_text() == f"# Results of `python -m shadefs.bench miss_cost`\n\n{start}\ny\n{end}\n"
    assert b.results_path() == os.path.join(runner.ROOT, "docs", "results", "miss_cost.md")


def test_json_is_written_only_with_json(tmp_path):
    _bench(tmp_path).save_json({"a": 1})
    out = tmp_path / "o.json"
    _bench(tmp_path, json=str(out)).save_json({"a": 1})
    assert out.read_text() == '{\n "a": 1\n}'


def test_a_bad_option_stops_the_run_with_status_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        _bench(tmp_path).error("--files must be >= 1")
    assert e.value.code == 2
    assert capsys.readouterr().err == "python -m shadefs.bench miss_cost: error: --files must be >= 1\n"


def test_clean_ups_run_last_first_and_a_failing_one_does_not_stop_the_others(tmp_path, capsys):
    b = _bench(tmp_path)
    calls = []
    b.on_close(lambda: calls.append(1))
    b.on_close(lambda: 1 / 0)
    b.on_close(lambda: calls.append(3))
    b.close()
    assert calls == [3, 1]
    assert "clean-up failed: division by zero" in capsys.readouterr().err


@pytest.mark.slow  # compiles a C extension (about a second)
def test_a_baseline_whose_c_source_differs_gets_its_own_build(tmp_path):
    import filecmp
    import glob
    import shutil
    import subprocess

    from shadefs.testing import baseline

    if not shutil.which("cc") or not glob.glob(os.path.join(runner.ROOT, "shadefs", "fuse", "_fastloop*.so")):
        pytest.skip("no C compiler, or the working tree's compiled loop is not built")
    # the revision before the last change of the compiled loop's source: a different source
    revs = subprocess.run(["git", "-C", runner.ROOT, "log", "-2", "--format=%h", "--", "shadefs/fuse/_fastloop.c"],
                          capture_output=True, text=True, check=True).stdout.split()
    if len(revs) < 2:
        pytest.skip("this checkout's history has one version of the compiled loop (a shallow clone)")
    d, _ = baseline.extract(runner.ROOT, revs[1], build=True)
    try:
        [theirs] = glob.glob(os.path.join(d, "shadefs", "fuse", "_fastloop*.so"))
        [ours] = glob.glob(os.path.join(runner.ROOT, "shadefs", "fuse", "_fastloop*.so"))
        assert not filecmp.cmp(theirs, ours, shallow=False)  # built from REV's source, not copied
        assert not os.path.exists(os.path.join(d, "build"))
    finally:
        shutil.rmtree(d)


def test_a_sides_children_import_its_package_even_from_the_checkout(tmp_path, monkeypatch):
    # ``python -m`` puts the working directory first on sys.path: from the checkout's root, a baseline's
    # daemon would run the checkout's package unless the side's environment keeps the directory off it
    import subprocess
    import sys

    pkg = tmp_path / "shadefs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text("print('the baseline package')\n")
    monkeypatch.chdir(runner.ROOT)
    run = lambda side: subprocess.run([sys.executable, "-m", "shadefs", "version"], env=side.env,  # noqa: E731
                                      capture_output=True, text=True, check=True).stdout.strip()
    assert run(runner.Side("base", str(tmp_path))) == "the baseline package"
    assert run(runner.Side("tree", None)).startswith("shadefs ")

"""shadefs.bench.miss_cost's sides for 1 against 2 cores (``--cpus A/B``), in process: no tree is written and no
daemon started before the options are checked."""
import pytest

from shadefs.bench import runner
from shadefs.bench.miss_cost import cpu_sides


def test_several_cpu_lists_make_one_working_tree_side_each_pinned_to_its_list():
    sides = cpu_sides("0/0,1")
    assert [(s.name, s.path, s.cpus) for s in sides] == [("cpu0", None, "0"), ("cpu0+1", None, "0,1")]
    assert all(s.is_tree for s in sides)


def test_one_cpu_list_or_none_leaves_the_sides_to_the_runner():
    assert cpu_sides("0") == [] and cpu_sides(None) == []


def test_several_cpu_lists_with_a_baseline_are_refused_before_any_work(tmp_path, capsys):
    p, mod = runner.parser_for("miss_cost")
    args = p.parse_args(["--cpus", "0/0,1", "--source-dir", str(tmp_path)])  # the default baseline: main
    with pytest.raises(SystemExit) as e:
        mod.run(args, runner.Bench("miss_cost", args))
    assert e.value.code == 2
    assert capsys.readouterr().err == ("python -m shadefs.bench miss_cost: error: --cpus with several lists "
                                       "compares the working tree with itself: add --baseline none\n")
    assert list(tmp_path.iterdir()) == []  # no source tree written

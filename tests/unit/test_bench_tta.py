"""python -m shadefs.bench tta: the run limits (--run-timeout, --until), the GETs per epoch, and the summary of runs stopped early."""

import pytest

from shadefs.bench import runner, tta as bt

DAY = 20_000 * 86400  # a UTC midnight


def test_until_is_the_next_such_time_of_day_in_utc():
    assert bt.until_epoch("06:05", DAY + 4 * 3600) == DAY + 6 * 3600 + 5 * 60
    assert bt.until_epoch("06:05", DAY + 7 * 3600) == DAY + 86400 + 6 * 3600 + 5 * 60  # passed: tomorrow's
    assert bt.until_epoch("00:00", DAY) == DAY + 86400


@pytest.mark.parametrize("bad", ["6", "06-05", "24:00", "06:60", "ab:cd", ""])
def test_until_refuses_what_is_not_hh_mm(bad):
    with pytest.raises(ValueError, match="HH:MM"):
        bt.until_epoch(bad, DAY)


def test_run_limit_is_the_run_timeout_capped_by_the_time_left():
    assert bt.run_limit(0, None, DAY) is None
    assert bt.run_limit(900, None, DAY) == 900
    assert bt.run_limit(0, DAY + 600, DAY) == 600
    assert bt.run_limit(900, DAY + 600, DAY) == 600
    assert bt.run_limit(300, DAY + 600, DAY) == 300


def _args(argv):
    p, _ = runner.parser_for("tta")
    a = p.parse_args(argv)
    bt.check_args(a, runner.Bench("tta", a, argv))
    return a


def test_check_args_turns_until_into_a_time_and_refuses_a_negative_timeout():
    a = _args(["--data", "d", "--until", "06:05", "--run-timeout", "1200", "--stop-after", "3"])
    assert a.until % 86400 == 6 * 3600 + 5 * 60 and a.run_timeout == 1200 and a.stop_after == 3
    with pytest.raises(SystemExit):
        _args(["--data", "d", "--run-timeout", "-1"])


def test_gets_per_epoch_are_the_differences_of_the_counts_at_each_record():
    assert bt.gets_per_epoch({"gets_at_epoch": [100, 250, 330]}) == [100, 150, 80]
    assert bt.gets_per_epoch({}) == []


def _epochs(accs, secs=10.0):
    return [{"epoch": i + 1, "epoch_time_s": secs, "test_acc": a, "opens": 100, "hits": 10, "prefetched": 0}
            for i, a in enumerate(accs)]


def _run(mode, seed, accs, gets, partial=False):
    return {"mode": mode, "label": bt.MODES[mode][0], "seed": seed, "epochs": _epochs(accs), "gets": gets,
            "gets_at_epoch": [], "partial": partial, "stopped": "run timeout (30 s)" if partial else None}


def test_the_summary_counts_a_run_stopped_early_in_its_times_but_not_its_gets(tmp_path, capsys):
    saved = {"setup": {"delay_ms": 1, "pct": "10%", "workers": 2, "seeds": [0, 1], "modes": ["shuffle", "shade"],
                       "train_images": 100},
             "load_start": [1.0, 1.0, 1.0], "load_end": [1.0, 1.0, 1.0],
             "runs": [_run("shuffle", 0, [80, 84, 86], 300), _run("shuffle", 1, [81, 85, 87], 320),
                      _run("shade", 0, [82, 86, 88], 150), _run("shade", 1, [83, 86], 90, partial=True)]}
    bt.report(saved, [85], str(tmp_path / "tta.png"))
    rows = {line.split(" | ")[0]: line.split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith(("shuffle=True + static |", "ShadeSampler + shade |"))
            and len(line.split(" | ")) == 10}  # the summary's rows (one target)
    shuffle, shade = rows["shuffle=True + static"], rows["ShadeSampler + shade"]
    assert shuffle[1] == "2" and shuffle[6] == "310"           # GETs per run: the whole runs' mean
    assert shuffle[8] == "25 (20..30), 2/2 seeds"              # 85 %: epoch 3 (30 s) and epoch 2 (20 s)
    assert shade[1] == "2 (1 stopped early)" and shade[6] == "150"  # the stopped run's GETs are not a run's
    assert shade[8] == "20 (20..20), 2/2 seeds"                # the stopped run reached 85 % at epoch 2
    assert shade[9] == "30 (30..30), 1/2 seeds"                # uniform's final (86.5 %): only the whole run

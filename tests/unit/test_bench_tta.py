"""scripts/bench_tta.py: the run limits (--run-timeout, --until) and the GETs per epoch."""

import pytest

from conftest import load_script

bt = load_script("bench_tta")
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


def test_parse_args_turns_until_into_a_time_and_refuses_a_negative_timeout():
    a = bt.parse_args(["--data", "d", "--until", "06:05", "--run-timeout", "1200", "--stop-after", "3"])
    assert a.until % 86400 == 6 * 3600 + 5 * 60 and a.run_timeout == 1200 and a.stop_after == 3
    with pytest.raises(SystemExit):
        bt.parse_args(["--data", "d", "--run-timeout", "-1"])


def test_gets_per_epoch_are_the_differences_of_the_counts_at_each_record():
    assert bt.gets_per_epoch({"gets_at_epoch": [100, 250, 330]}) == [100, 150, 80]
    assert bt.gets_per_epoch({}) == []

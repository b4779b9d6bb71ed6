"""The demo's summary: per mode the epoch times, the training reads' hit ratio and prefetched share, the GETs,
the test accuracy and the speed-up over the direct reader; and its picture."""
import argparse

from conftest import load_script, require

demo = load_script("demo")


def run(mode, times, gets, acc, cache=None):
    policy, sampler, _ = demo.MODES[mode]
    epochs = [dict({"epoch": i + 1, "epoch_time_s": t}, **(cache[i] if cache else {})) for i, t in enumerate(times)]
    return {"mode": mode, "policy": policy, "sampler": sampler, "gets": gets, "stats": {}, "trace": None,
            "train": {"epochs": epochs, "final_test_acc": acc}}


def counts(opens, hits, prefetched):
    return {"opens": opens, "hits": hits, "prefetched": prefetched, "hit_ratio": hits / opens}


RUNS = [run("direct", [20.0, 20.0], 4003, 65.5),
        run("plan", [10.0, 6.0], 5000, 69.0, [counts(100, 0, 90), counts(100, 20, 75)]),
        run("importance", [8.0, 2.0], None, 71.25, [counts(100, 30, 50), counts(100, 90, 5)])]


def test_rows_sum_the_epochs_and_divide_the_direct_readers_time():
    assert demo.summary_rows(RUNS) == [
        ["direct", "shuffle=True", "(no shadefs)", "20.0, 20.0", "-", "-", "4,003", "65.50%", "1.00x"],
        ["plan", "PlanSampler", "static", "10.0, 6.0", "10.0%", "82.5%", "5,000", "69.00%", "2.50x"],
        ["importance", "ShadeSampler", "shade", "8.0, 2.0", "60.0%", "27.5%", "-", "71.25%", "4.00x"]]


def test_without_a_direct_run_there_is_no_speed_up():
    assert [r[-1] for r in demo.summary_rows(RUNS[1:])] == ["-", "-"]


def test_the_picture_is_a_png(tmp_path):
    require("matplotlib.pyplot")
    args = argparse.Namespace(png=str(tmp_path / "sub" / "demo.png"), epochs=2, full=False, train_images=1500,
                              delay_ms=10.0, ram_cache="5%", disk_cache_size="15%")
    demo.plot(args, RUNS)
    assert (tmp_path / "sub" / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

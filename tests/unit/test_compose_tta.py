"""scripts/compose_tta.py: the rig's seconds per epoch composed with the in-memory accuracy per epoch."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compose_tta.py"


ct = load_script("compose_tta")


def _epochs(pairs):
    return [{"epoch": i + 1, "epoch_time_s": s, "test_acc": acc} for i, (s, acc) in enumerate(pairs)]


RIG = {"runs": [
    {"mode": "shade", "seed": 0, "epochs": _epochs([(80.0, 85.5), (40.0, 88.0)])},
    {"mode": "shuffle", "seed": 0, "epochs": _epochs([(100.0, 84.0), (50.0, 86.0), (70.0, 87.5)])},
]}
MEMORY = {"results": [
    {"config": "uniform", "seed": 0, "epochs": [{"test_acc": a} for a in (80.0, 86.0, 90.0, 91.0)]},
    {"config": "uniform", "seed": 1, "epochs": [{"test_acc": a} for a in (85.0, 88.0, 89.0, 90.5)]},
    {"config": "shade", "seed": 0, "epochs": [{"test_acc": a} for a in (84.0, 85.0, 90.8, 90.9)]},
    {"config": "shade", "seed": 1, "epochs": [{"test_acc": a} for a in (86.0, 89.5, 89.9, 90.0)]},
    {"config": "shade:rep_factor=1", "seed": 0, "epochs": [{"test_acc": a} for a in (99.0, 99.0, 99.0, 99.0)]},
]}


def test_rig_seconds_cold_is_epoch_one_and_warm_the_mean_of_all_later_epochs_over_runs():
    rig = {"runs": RIG["runs"] + [
        {"mode": "shuffle", "seed": 1, "epochs": _epochs([(120.0, 80.0), (60.0, 85.0)])},
        {"mode": "plan", "seed": 0, "epochs": []},  # a run stopped before its first epoch: left out
    ]}
    sec = ct.rig_seconds(rig)
    assert sec == {"shade": {"cold": 80.0, "warm": 40.0, "epochs": [2], "seeds": [0]},
                   "shuffle": {"cold": 110.0, "warm": 60.0, "epochs": [3, 2], "seeds": [0, 1]}}


def test_uniform_final_is_the_mean_of_uniforms_last_epochs_rounded():
    assert ct.uniform_final(MEMORY) == 90.75


def test_composed_time_to_each_target_per_seed_and_mean_over_seeds_that_reached_it():
    result = ct.compose(RIG, MEMORY, [85.0, 89.0])
    assert result["uniform_final"] == 90.75
    assert result["targets"] == [85.0, 89.0, 90.75]
    shuffle = result["modes"]["shuffle"]
    assert (shuffle["config"], shuffle["cold"], shuffle["warm"]) == ("uniform", 100.0, 60.0)
    # uniform seed 0 reaches 85 at epoch 2 (100 + 60 s), seed 1 at epoch 1 (100 s)
    assert [(t["per_seed"], t["mean_s"], t["reached"], t["seeds"]) for t in shuffle["to"]] == [
        ({0: (2, 160.0), 1: (1, 100.0)}, 130.0, 2, 2),
        ({0: (3, 220.0), 1: (3, 220.0)}, 220.0, 2, 2),
        ({0: (4, 280.0), 1: None}, 280.0, 1, 2),
    ]
    assert (shuffle["all_epochs"], shuffle["all_epochs_s"]) == (4, 280.0)  # 100 + 3 x 60
    shade = result["modes"]["shade"]
    assert (shade["config"], shade["cold"], shade["warm"]) == ("shade", 80.0, 40.0)
    assert [(t["per_seed"], t["mean_s"], t["reached"]) for t in shade["to"]] == [
        ({0: (2, 120.0), 1: (1, 80.0)}, 100.0, 2),
        ({0: (3, 160.0), 1: (2, 120.0)}, 140.0, 2),
        ({0: (3, 160.0), 1: None}, 160.0, 1),
    ]


def test_a_target_no_seed_reaches_has_no_mean():
    result = ct.compose(RIG, MEMORY, [95.0])
    assert [(t["per_seed"], t["mean_s"], t["reached"]) for t in result["modes"]["shade"]["to"]][0] == (
        {0: None, 1: None}, None, 0)


def test_plan_takes_uniforms_accuracies_and_a_mode_with_one_epoch_measured_cannot_compose_later_epochs():
    rig = {"runs": [{"mode": "plan", "seed": 0, "epochs": _epochs([(90.0, 85.0), (30.0, 86.0)])}]}
    plan = ct.compose(rig, MEMORY, [85.0])["modes"]["plan"]
    assert plan["config"] == "uniform"
    assert plan["to"][0]["per_seed"] == {0: (2, 120.0), 1: (1, 90.0)}
    one = {"runs": [{"mode": "plan", "seed": 0, "epochs": _epochs([(90.0, 85.0)])}]}
    assert ct.time_to([85.0, 86.0], 80.0, 90.0, None) == (1, 90.0)
    with pytest.raises(ValueError, match="warm"):
        ct.compose(one, MEMORY, [85.0])  # seed 0 reaches 85 only at epoch 2


def test_seed_check_sets_the_rigs_accuracy_beside_the_in_memory_run_of_the_same_seed_and_sampler():
    check = ct.seed_check(RIG, MEMORY, seed=0)
    assert check == {"shade": [(1, 85.5, 84.0, 1.5), (2, 88.0, 85.0, 3.0)],
                     "shuffle": [(1, 84.0, 80.0, 4.0), (2, 86.0, 86.0, 0.0), (3, 87.5, 90.0, -2.5)]}
    assert ct.seed_check(RIG, MEMORY, seed=1) == {}  # the rig ran seed 0 only


def test_command_prints_the_tables_and_draws_the_picture(tmp_path):
    rig, mem = tmp_path / "rig.json", tmp_path / "mem.json"
    rig.write_text(json.dumps(RIG))
    mem.write_text(json.dumps(MEMORY))
    png, out = tmp_path / "tta.png", tmp_path / "composed.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rig", str(rig), "--memory", str(mem), "--png", str(png),
                           "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert ("| shuffle=True + static | `uniform` | 3 | 100.0 s | 60.0 s | 130 s, 2/2 (160 / 100) | "
            "220 s, 2/2 (220 / 220) | 280 s, 1/2 (280 / -) | 280 s (4) |") in proc.stdout
    assert "| ShadeSampler + shade | 2 | 88.00 | 85.00 | +3.00 |" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads(out.read_text())
    assert saved["composition"]["modes"]["shade"]["to"][2]["mean_s"] == 160.0

"""shadefs.testing.datasets.random_tree: the read benchmarks' tree of random files, reused when unchanged."""
from __future__ import annotations

import os

from shadefs.testing.datasets import random_tree


def test_the_tree_has_the_listed_files_and_sizes(tmp_path):
    root = str(tmp_path / "t")
    files = random_tree(root, 7, 100, seed=1, per_dir=3)
    assert [rel for rel, _ in files] == [f"c{i // 3:04d}/f{i:07d}.bin" for i in range(7)]
    assert all(70 <= size <= 130 for _, size in files)
    assert [(rel, os.path.getsize(os.path.join(root, rel))) for rel, _ in files] == files
    assert sorted(os.listdir(root)) == ["c0000", "c0001", "c0002", "manifest.json"]


def test_an_unchanged_tree_is_reused_and_another_list_replaces_it(tmp_path):
    root = str(tmp_path / "t")
    first = random_tree(root, 5, 100, seed=1)
    p = os.path.join(root, first[0][0])
    before = open(p, "rb").read()
    assert random_tree(root, 5, 100, seed=1) == first
    assert open(p, "rb").read() == before          # not rewritten: random bytes would differ
    other = random_tree(root, 4, 100, seed=2)
    assert len(other) == 4 and not os.path.exists(os.path.join(root, "c0000/f0000004.bin"))
    assert [(rel, os.path.getsize(os.path.join(root, rel))) for rel, _ in other] == other

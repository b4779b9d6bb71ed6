"""``shadefs warm``: prefetch through the policy, not counted as opens; later opens are hits."""
import os

import pytest

pytestmark = pytest.mark.usefixtures("fuse")  # skipped without /dev/fuse + fusermount3; failed under CI=true


def test_warm_admits_through_the_policy_and_counts_no_opens(small_tree, mount, cli):
    src, spec = small_tree
    # static, RAM 3000 B: in path order cat/01 (2000) fits, cat/03 (4000) does not, ..., dog/00 (1000) fits
    m = mount(src, "--ram-cache", "3000", "--no-kernel-cache")
    r = cli("warm", m.path, "--quiet")
    assert r.stdout.strip() == ("warm: 10 files: 2 admitted to RAM, 0 to disk, 0 already cached, "
                                "8 refused by the policy, 0 failed; 53.7 KiB read from the backend")
    s = m.stats()
    assert s["opens"] == 0 and s["tiers"]["ram"]["files"] == 2 and s["tiers"]["ram"]["used_bytes"] == 3000
    for rel in ("cat/01.bin", "dog/00.bin", "dog/02.bin"):
        with open(os.path.join(m.path, rel), "rb") as f:
            assert f.read() == spec[rel]
    s = m.stats()
    assert s["opens"] == 3 and s["hits"]["ram"] == 2 and s["misses"] == 1
    r = cli("warm", m.path, "cat/01.bin", "--quiet")
    assert "1 already cached" in r.stdout


def test_warm_rejects_paths_outside_the_mount(small_tree, mount, cli, tmp_path):
    src, _ = small_tree
    m = mount(src, "--ram-cache", "1MiB")
    r = cli("warm", m.path, "../", check=False)
    assert r.returncode == 2 and "not inside" in r.stderr
    r = cli("warm", m.path, "cat/none.bin", check=False)
    assert r.returncode == 2 and "no such file" in r.stderr

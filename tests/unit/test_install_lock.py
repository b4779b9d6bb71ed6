"""The installs wait for another apt's dpkg lock (a fresh machine's unattended upgrades) instead of failing."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_apt_get_of_the_makefile_and_ci_waits_for_the_dpkg_lock():
    calls = []
    for name in ("Makefile", ".ci/run"):
        calls += re.findall(r"apt-get\b[^;&|\n]*", (ROOT / name).read_text())
    assert len(calls) == 2  # update, install (the Makefile's deps target; .ci/run calls make)
    assert all("-o DPkg::Lock::Timeout=600" in c for c in calls), calls

"""Configuration in one place: every SHADEFS_* variable is read by shadefs.config.Environment alone,
listed in ENV_VARS and documented in docs/configuration.md ("Environment") with its status, and no page
names a variable that does not exist."""
import re
from pathlib import Path

from shadefs.config import ENV_VARS, PAUSE_POINTS, Environment

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"SHADEFS_[A-Z0-9_]*[A-Z0-9]")
CODE = [p for d in ("shadefs", "hooks") for p in sorted((ROOT / d).rglob("*.py"))]


def documented():
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("\n## Environment\n", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `(SHADEFS_[A-Z0-9_]+)` \| ([a-z ]+) \|", section, flags=re.M))


def test_every_variable_in_the_code_is_in_config_and_documented_with_its_status():
    in_code = {n for p in CODE for n in NAME.findall(p.read_text())}
    config = (ROOT / "shadefs" / "config.py").read_text()
    assert in_code == set(ENV_VARS)
    assert all(f'"{n}"' in config for n in in_code)
    docs = documented()
    status = {"stable": "stable", "experimental": "experimental", "testing": "testing only"}
    assert {n: docs[n] for n in ENV_VARS} == {n: status[s] for n, s in ENV_VARS.items()}


def test_only_config_reads_the_environment_for_them():
    """No line outside config.py reads the environment with a SHADEFS_ name (or the client's constants).
    The benchmarks set such variables for the daemons they start (shadefs/bench): that is no read."""
    read = re.compile(r"(environ|getenv).*(SHADEFS_|ENV_ENDPOINT|ENV_CREDENTIALS)")
    bench = ROOT / "shadefs" / "bench"
    found = [f"{p.relative_to(ROOT)}: {line.strip()}" for p in CODE
             if p.name != "config.py" and bench not in p.parents
             for line in p.read_text().splitlines() if read.search(line)]
    assert found == []


def test_no_page_names_a_variable_that_does_not_exist():
    pages = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    named = {n: str(p.relative_to(ROOT)) for p in pages for n in NAME.findall(p.read_text())}
    test_only = set(NAME.findall((ROOT / "tests" / "conftest.py").read_text())) - set(ENV_VARS)
    assert {n: p for n, p in named.items() if n not in ENV_VARS and n not in test_only} == {}
    assert set(documented()) == set(ENV_VARS) | test_only


def test_from_env_reads_flags_sizes_and_the_pause_and_ignores_malformed_values():
    assert Environment.from_env({}) == Environment()
    env = Environment.from_env({"SHADEFS_ENDPOINT": " ipc:///x ", "SHADEFS_CREDENTIALS": "/c.json",
                                "SHADEFS_NO_OPENAT2": "1", "SHADEFS_FUSE_PYTHON_LOOP": "1",
                                "SHADEFS_FUSE_GIL_OPENS": "1", "SHADEFS_FUSE_CHECK_REPLIES": "1",
                                "SHADEFS_AUDIT": "1", "SHADEFS_LOOSE_BUFFERS": "4096",
                                "SHADEFS_TESTING_PAUSE": "cli-forked:/tmp/p:x"})
    assert env == Environment(endpoint="ipc:///x", credentials="/c.json", no_openat2=True, fuse_python_loop=True,
                              fuse_gil_opens=True, fuse_check_replies=True, audit=True, loose_buffers=4096,
                              testing_pause=("cli-forked", "/tmp/p:x"))
    bad = Environment.from_env({"SHADEFS_AUDIT": "yes", "SHADEFS_LOOSE_BUFFERS": "lots",
                                "SHADEFS_TESTING_PAUSE": "cli-start", "SHADEFS_NO_OPENAT2": "0"})
    assert bad == Environment()
    assert len(set(PAUSE_POINTS)) == 6

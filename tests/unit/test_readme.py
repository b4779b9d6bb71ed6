"""README's "Use" section says what a new user needs after the two set-up commands."""
import re
from pathlib import Path

from shadefs.config import parse_size

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
USE = README[README.index("## Use"):]


def test_exactly_two_set_up_commands():
    first_block = README.split("```")[1]
    assert re.findall(r"^make \w+", first_block, flags=re.M) == ["make demo", "make test"]


def test_use_says_how_to_reach_the_venv_and_build_the_dataset():
    assert ". .venv/bin/activate" in USE
    assert "`make dataset`" in USE
    assert "scripts/make_fashion_mnist.py DIR" in USE
    assert "DIR.complete" in USE  # the marker is not part of the mounted tree


def test_the_use_block_builds_what_it_mounts_before_mounting_it():
    block = USE.split("```")[1]
    source = re.search(r"^shadefs mount (\S+) ", block, flags=re.M).group(1)
    assert source == "data/fmnist"
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert re.search(r"^DATA\s*\?=\s*data/fmnist$", makefile, flags=re.M)  # what `make dataset` builds
    assert block.index("make dataset") < block.index("shadefs mount")


def test_every_size_the_readme_names_parses_as_it_says():
    binary = re.search(r"binary units \(([^)]*)\)", USE).group(1)
    decimal = re.search(r"decimal units \(([^)]*)\)", USE).group(1)
    assert "powers of 1024" in binary and "powers of 1000" in decimal
    powers = {"k": 1, "m": 2, "g": 3, "t": 4}
    for base, text in ((1024, binary), (1000, decimal)):
        for number, unit in re.findall(r"`(\d+)([A-Za-z]+)`", text):
            assert parse_size(number + unit).nbytes == int(number) * base ** powers[unit[0].lower()]
    for unit in ("k", "M", "G", "T"):  # the single letters the README names
        assert parse_size("3" + unit).nbytes == 3 * 1000 ** powers[unit.lower()]
    assert parse_size("64mb").nbytes == parse_size("64MB").nbytes  # "case does not matter"

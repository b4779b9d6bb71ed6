"""The benchmarks' shared helpers in shadefs.testing: random_file, completed_tree / mark_complete,
write_table_section, saved_or_measured, proc_vm."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from shadefs.testing import proc_vm
from shadefs.testing.datasets import completed_tree, mark_complete, random_file
from shadefs.testing.docsection import saved_or_measured, write_table_section


def test_random_file_writes_the_size_and_reuses_a_file_of_that_size(tmp_path):
    p = str(tmp_path / "f.bin")
    random_file(p, (4 << 20) + 5)                 # two writes: 4 MiB, then 5 bytes
    assert os.path.getsize(p) == (4 << 20) + 5
    before = open(p, "rb").read()
    random_file(p, (4 << 20) + 5)
    assert open(p, "rb").read() == before          # not rewritten: random bytes would differ
    random_file(p, 3)
    assert os.path.getsize(p) == 3


def test_write_table_section_writes_heading_intro_and_table_between_the_markers(tmp_path):
    doc = tmp_path / "r.md"
    doc.write_text("# R\n\n<!-- m:start -->\nold\n<!-- m:end -->\ntail\n")
    write_table_section(str(doc), "m", "Title", ["line 1", "line 2"], "| a |\n|---|\n| 1 |")
    assert doc.read_text() == ("# R\n\n<!-- m:start -->\n## Title\n\nline 1\nline 2\n\n| a |\n|---|\n| 1 |\n"
                               "<!-- m:end -->\ntail\n")


def test_proc_vm_reads_this_process_and_is_zero_for_one_that_exited():
    vm = proc_vm(os.getpid())
    assert vm["VmRSS"] > 0 and vm["VmHWM"] >= vm["VmRSS"] and vm["VmRSS"] % 1024 == 0
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()                                       # reaped: /proc/PID is gone
    assert proc_vm(p.pid) == {"VmRSS": 0, "VmHWM": 0}


def test_a_tree_is_complete_once_marked_and_an_unreadable_marker_is_none(tmp_path):
    root = str(tmp_path)
    assert completed_tree(root) is None
    mark_complete(root, {"files": 3, "bytes": 30})
    assert completed_tree(root) == {"files": 3, "bytes": 30}
    (tmp_path / ".complete").write_text("{not json")
    assert completed_tree(root) is None


def test_saved_results_are_read_and_measured_ones_saved(tmp_path):
    save = str(tmp_path / "run.json")
    calls = []
    assert saved_or_measured(None, save, lambda: calls.append(1) or {"a": 1}) == {"a": 1}
    assert calls == [1] and json.loads(open(save).read()) == {"a": 1}
    assert saved_or_measured(save, None, lambda: calls.append(2)) == {"a": 1}
    assert calls == [1]                            # a saved run is not measured again
    assert saved_or_measured(None, None, lambda: [2]) == [2]

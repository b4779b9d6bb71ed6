"""The per-file state table (shadefs/cache/state.py): the transitions drawn in docs/architecture.md are the
code's, one to one, each is a method of StateTable, and each refuses a file in a state it does not start
from (nothing changes)."""
import os
import re

import numpy as np
import pytest

from shadefs.cache import state as st
from shadefs.cache.index import TierIndex
from shadefs.cache.state import IllegalTransition, Pin, StateTable
from shadefs.cache.tiers import MemoryTier
from shadefs.policies import Importance, get_policy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def documented():
    """{name: (from states, to states)} of the transition table in docs/architecture.md."""
    with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
        text = f.read()
    section = text[text.index("### The per-file state machine"):]
    section = section[:section.index("\n### ", 1)]
    header = "| transition | from | to |"
    assert section.count(header) == 1
    rows = section[section.index(header):].split("\n")[2:]
    out = {}
    for row in rows:
        if not row.startswith("|"):
            break
        cells = [c.strip() for c in row.strip("|").split("|")]
        name = re.fullmatch(r"`(\w+)`", cells[0]).group(1)
        states = [tuple(re.findall(r"`([\w()]+)`", c)) for c in cells[1:3]]
        assert name not in out, f"{name} documented twice"
        out[name] = tuple(states)
    return out


def in_code():
    out = {}
    for table in (st.TRANSITIONS, st.ENTRY_TRANSITIONS):
        for name, (src, dst) in table.items():
            out[name] = (tuple(getattr(s, "value", s) for s in src), tuple(getattr(s, "value", s) for s in dst))
    return out


def test_the_documented_transitions_are_the_codes():
    assert documented() == in_code()


def test_every_transition_is_a_method_of_the_table_and_every_state_is_documented():
    for name in in_code():
        assert callable(getattr(StateTable, name, None)), name
    public = {n for n in vars(StateTable) if not n.startswith("_") and callable(vars(StateTable)[n])}
    assert public - {"state"} == set(in_code()), "a state change outside the transition table"
    with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
        text = f.read()
    for s in st.FileState:
        assert f"| `{s.value}`" in text, s


@pytest.fixture
def table():
    imp = Importance(8)
    ram = TierIndex("ram", 10000, get_policy("lru")(10000, imp))
    disk = TierIndex("disk", 10000, get_policy("lru")(10000, imp))
    store = MemoryTier()

    class Entries:
        gen = np.zeros(8, dtype=np.uint64)
        csum = np.zeros(8, dtype=np.uint64)
    t = StateTable(ram, store._data, disk, Entries(), np.zeros(8, dtype=np.bool_))
    return t, store


def test_each_transition_refuses_a_file_in_another_state(table):
    t, store = table
    # 0: ram, 1: disk, 2: fetching, 3: moving, 4: absent
    assert t.ram_index.reserve(0, 100) == []
    t.commit_fetch(0, t.begin_fetch(0, "ram"), b"x" * 100, store)
    assert t.disk_index.reserve(1, 100, hold_victims=True) == []
    t.commit_fetch(1, t.begin_fetch(1, "disk"), None, gen=7, csum=9)
    fetch = t.begin_fetch(2, "memory")
    store.put(3, b"y" * 50)
    move = t.begin_move(3, b"y" * 50, Pin(0, 50, st.PIN_LOOSE, 3))
    store.pop(3)
    assert [t.state(f).value for f in range(5)] == ["ram", "disk", "fetching", "moving", "absent"]
    before = (dict(t.flights), dict(t.ram_index.sizes), dict(t.disk_index.sizes))
    for name, fid in [("begin_fetch", 0), ("begin_fetch", 1), ("begin_fetch", 2), ("begin_fetch", 3),
                      ("begin_move", 1), ("begin_move", 4), ("evict_ram", 2), ("evict_ram", 4),
                      ("promote", 0), ("promote", 4), ("drop_entry", 3), ("drop_entry", 4)]:
        with pytest.raises(IllegalTransition):
            if name == "begin_fetch":
                t.begin_fetch(fid, "ram")
            elif name == "begin_move":
                t.begin_move(fid, b"", Pin(0, 0, st.PIN_LOOSE, fid))
            elif name == "promote":
                t.promote(fid, 100, b"z" * 100, store)
            elif name == "drop_entry":
                t.drop_entry(fid, 100)
            else:
                getattr(t, name)(fid)
    with pytest.raises(IllegalTransition):
        t.commit_fetch(3, fetch, b"")          # not its fetch
    with pytest.raises(IllegalTransition):
        t.commit_move(2, move, 1, 1)           # not its move
    with pytest.raises(IllegalTransition):
        t.drop_move(4, move)
    with pytest.raises(IllegalTransition):
        t.evict_disk(0)                        # resident in RAM: no disk victim
    assert (dict(t.flights), dict(t.ram_index.sizes), dict(t.disk_index.sizes)) == before
    # and the legal ones, from those states
    dying = t.drop_entry(1, 100)
    assert dying == st.DyingEntry(1, 7, 9, 100) and t.state(1).value == "absent"
    assert t.disk_index.dying_bytes == 100
    t.entry_unlinked(dying)
    assert t.disk_index.dying_bytes == 0
    t.release_fetch(2, fetch, b"q")
    assert t.state(2).value == "absent" and fetch.tier is None and fetch.data == b"q"
    t.drop_move(3, move)
    assert t.state(3).value == "absent" and move.pin.refs == 1   # the caller drops the move's ref

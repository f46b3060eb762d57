"""Holder identity through launchers (issue 13, item 5): the process on the pipe and the
process that allocates GPU memory are one holder, on recorded Windows process trees
(tests/data/windows/process_trees.json), and the live snapshot on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rbroker.broker.holders import Ancestry, Holder
from rbroker.broker.launchers import (
    ProcessRecord,
    ancestors,
    interpreter_of,
    is_launcher_image,
    same_holder,
    snapshot_around,
)

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

TREES = Path(__file__).parents[2] / "data" / "windows" / "process_trees.json"


@pytest.fixture(scope="module")
def tree() -> dict[int, ProcessRecord]:
    rows = json.loads(TREES.read_text())["processes"]
    return {r["pid"]: ProcessRecord(**r) for r in rows}


def test_venv_launcher_stands_for_the_interpreter_it_started(
    tree: dict[int, ProcessRecord],
) -> None:
    assert is_launcher_image(tree[9100])
    assert not is_launcher_image(tree[9104])  # the base interpreter
    assert interpreter_of(tree, 9100) == 9104
    assert interpreter_of(tree, 9104) == 9104
    assert same_holder(tree, 9100, 9104)  # launcher on the pipe, interpreter allocates
    assert same_holder(tree, 9104, 9104)


def test_multiprocessing_worker_through_the_venv_launcher_is_the_same_holder(
    tree: dict[int, ProcessRecord],
) -> None:
    # 9104 (the interpreter) starts a worker via the venv's python.exe: 9200 → 9204
    assert [r.pid for r in ancestors(tree, 9204)] == [9204, 9200, 9104, 9100, 7720, 4412]
    assert same_holder(tree, 9100, 9204)
    assert same_holder(tree, 9104, 9204)
    assert interpreter_of(tree, 9200) == 9204


def test_console_script_shim_then_venv_launcher_then_interpreter(
    tree: dict[int, ProcessRecord],
) -> None:
    # Scripts\rbroker.exe → Scripts\python.exe → base python.exe: two hops down
    assert interpreter_of(tree, 3300) == 3308
    assert interpreter_of(tree, 3304) == 3308
    # `rbroker run -- python train.py`: rbroker (3308) holds, train.py's interpreter
    # (3404, started through the venv launcher 3400) allocates
    assert interpreter_of(tree, 3308) == 3308  # a base interpreter is not a launcher
    assert same_holder(tree, 3308, 3404)
    assert same_holder(tree, 3300, 3404)
    assert not same_holder(tree, 3404, 3308)  # a child's lease is not its parent's memory


def test_py_launcher(tree: dict[int, ProcessRecord]) -> None:
    assert interpreter_of(tree, 5000) == 5004
    assert same_holder(tree, 5000, 5004)


def test_stale_parent_pid_reused_by_a_newer_process_is_no_parent(
    tree: dict[int, ProcessRecord],
) -> None:
    # 7000's ppid 6000 now names a process that started after 7000: not its parent
    assert [r.pid for r in ancestors(tree, 7000)] == [7000]
    assert interpreter_of(tree, 6000) == 6000  # it started nothing
    assert not same_holder(tree, 6000, 7000)


def test_a_tool_that_starts_two_interpreters_is_not_a_launcher(
    tree: dict[int, ProcessRecord],
) -> None:
    assert is_launcher_image(tree[8000])
    assert interpreter_of(tree, 8000) == 8000
    assert same_holder(tree, 8000, 8004) and same_holder(tree, 8000, 8008)  # its children
    assert not same_holder(tree, 8004, 8008)  # siblings are two holders


def test_a_launcher_whose_child_has_not_started_and_unknown_pids(
    tree: dict[int, ProcessRecord],
) -> None:
    assert interpreter_of(tree, 8500) == 8500
    assert interpreter_of(tree, 424242) == 424242
    assert not same_holder(tree, 9100, 5004)  # another launcher's interpreter


def test_a_cycle_of_launchers_ends() -> None:
    a = ProcessRecord(1, 2, "a.exe", "C:\\v\\Scripts\\a.exe", 10.0)
    b = ProcessRecord(2, 1, "b.exe", "C:\\v\\Scripts\\b.exe", 10.0)
    loop = {1: a, 2: b}
    assert interpreter_of(loop, 1) in (1, 2)
    assert len(list(ancestors(loop, 1))) == 2


def test_live_snapshot_on_this_machine_has_the_family() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        snap = snapshot_around(os.getpid())
        assert snap[os.getpid()].ppid == os.getppid()
        assert child.pid in snap and snap[child.pid].ppid == os.getpid()
        assert same_holder(snap, os.getpid(), child.pid)
        # the broker's attribution (psutil's parents, the same start-time check) agrees
        assert Holder.of(os.getpid()) in Ancestry().chain(child.pid)
        # no launcher images off Windows: every process stands for itself
        assert interpreter_of(snap, os.getpid()) == os.getpid()
    finally:
        child.kill()
        child.wait()
    assert snapshot_around(2**22 + 12345) == {}

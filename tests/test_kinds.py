"""The `unit` / `contract` / `e2e` marks come from what a test uses and are checked by what it
does (tests/conftest.py: `kind_of`, `UnitStartsNothing`): a `unit` test that starts a process
fails, naming it."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.conftest import PROP_PROCESSES, UnitStartsNothing, kind_of
from tests.desktop.inprocess import SLEEPER

pytestmark = pytest.mark.contract  # it starts processes to see them noticed


@pytest.mark.parametrize(
    ("rel", "fixtures", "kind"),
    [
        ("tests/e2e/test_x.py", [], "e2e"),
        ("tests/windows/test_x.py", ["broker"], "e2e"),
        ("tests/server/test_x.py", [], "contract"),
        ("tests/desktop/broker/test_x.py", ["broker_factory", "tmp_path"], "contract"),
        ("tests/desktop/broker/test_x.py", ["h", "tmp_path"], "unit"),
        ("tests/protocol/test_x.py", [], "unit"),
    ],
)
def test_the_kind_follows_what_a_test_uses(rel: str, fixtures: list[str], kind: str) -> None:
    item = SimpleNamespace(fixturenames=fixtures)
    assert kind_of(item, rel) == kind  # type: ignore[arg-type]


def test_a_process_started_while_watching_is_noticed_and_a_prop_is_not() -> None:
    assert tuple(SLEEPER) in PROP_PROCESSES
    check = UnitStartsNothing()
    check.watching = True
    try:
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        prop = subprocess.Popen(SLEEPER)
        prop.kill()
        prop.wait()
    finally:
        check.watching = False
    assert len(check.started) == 1 and check.started[0].startswith("subprocess.Popen")
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # not watching: not noticed
    assert len(check.started) == 1


def test_a_prop_is_known_by_its_command_line_as_windows_gives_it() -> None:
    """On Windows the audit event carries the command line as one string."""
    check = UnitStartsNothing()
    check.watching = True
    try:
        check._audit("subprocess.Popen", (None, subprocess.list2cmdline(SLEEPER), None, None))
        check._audit("subprocess.Popen", (None, "python.exe -c pass", None, None))
    finally:
        check.watching = False
    assert check.started == ["subprocess.Popen (None, 'python.exe -c pass')"]

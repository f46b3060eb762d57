"""The documentation's facts agree with the code: every option of every `rbroker` command is
in its row of the user guide's command table, the user guide's rounding examples are what
`{fraction}` prints, and the test count in docs/development.md is about what pytest collects."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rbroker._frameworks import fraction_text, memory_fraction
from rbroker.cli.main import build_parser

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

ROOT = Path(__file__).resolve().parents[1]
USER_GUIDE = ROOT / "docs" / "user-guide.md"  # the command table and the rounding examples
DEVELOPMENT = ROOT / "docs" / "development.md"  # the test count
_NOT_IN_ROWS = {"--help", "--socket", "--verbose"}  # --socket: the paragraph below the table
_ROW = re.compile(r"^\| `rbroker (\w+)[^`]*` \|")


def _rows() -> dict[str, str]:
    rows = {}
    for line in USER_GUIDE.read_text(encoding="utf-8").splitlines():
        m = _ROW.match(line)
        if m:
            rows[m.group(1)] = line
    return rows


def _commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_option_of_every_command_is_in_the_table(command: str) -> None:
    """Before: `rbroker release`, `run --ttl` and `broker --over-grant-grace` were missing."""
    row = _rows().get(command)
    assert row is not None, f"no row for rbroker {command} in the user guide's command table"
    parser = _commands()[command]
    options = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    missing = sorted(options - _NOT_IN_ROWS - {o for o in options if o in row})
    assert not missing, f"rbroker {command}: {missing} not in its row of the user guide"
    for action in parser._actions:
        if not action.option_strings and action.dest not in ("help", "cmd"):
            if action.choices:  # service install|remove|...
                assert all(str(choice) in row for choice in action.choices), action.choices
            else:  # LEASE, URL, CODE
                assert str(action.metavar or action.dest).upper() in row, action.dest


def test_the_rounding_examples_are_what_fraction_prints() -> None:
    """Before: the README said 0.00004 for 1 MiB; `{fraction}` prints 0.000040."""
    text = " ".join(USER_GUIDE.read_text(encoding="utf-8").split())
    m = re.search(
        r"\(8 GiB of 24 GiB → (\S+); 20 000 MiB of 80 GiB → (\S+); 1 MiB of 24 GiB → (\S+),",
        text,
    )
    assert m, "the rounding examples are gone from the user guide"
    assert m.groups() == (
        fraction_text(memory_fraction(8192, 24576)),
        fraction_text(memory_fraction(20000, 81920)),
        fraction_text(memory_fraction(1, 24576)),
    )
    assert m.groups() == ("0.333333", "0.244140", "0.000040")


NO_CACHE = ["-p", "no:cacheprovider"]


def _collected_here(request: pytest.FixtureRequest) -> int | None:
    """How many tests this run collected, when it collected the whole suite (no paths, `-k`,
    `-m` or deselection narrowed it; under xdist every worker collects them all); None
    otherwise."""
    config = request.config
    whole = [str(ROOT / "tests")]
    args = [str(Path(a).resolve()) for a in config.args]
    if args not in ([], whole, [str(ROOT)]):
        return None
    if config.getoption("keyword") or config.getoption("markexpr"):
        return None
    if config.getoption("deselect"):
        return None
    return len(request.session.items)


def test_the_test_count_is_about_what_pytest_collects(request: pytest.FixtureRequest) -> None:
    """Before: "about 1 400 tests" while pytest collected about 1 670. The run's own
    collection is the count when it is the whole suite; else pytest collects in a child."""
    collected = _collected_here(request)
    if collected is None:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", *NO_CACHE],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
        last = done.stdout.strip().splitlines()[-1]
        match = re.match(r"(\d+) tests? collected", last)
        assert match, done.stdout[-2000:] + done.stderr[-2000:]
        collected = int(match.group(1))
    text = " ".join(DEVELOPMENT.read_text(encoding="utf-8").split())
    said = re.search(r"runs all of about (\d[\d ]*\d) tests", text)
    assert said, "docs/development.md no longer says how many tests there are"
    stated = int(said.group(1).replace(" ", ""))
    assert abs(stated - collected) <= 0.1 * collected, (
        f"docs/development.md {stated}, collected {collected}"
    )

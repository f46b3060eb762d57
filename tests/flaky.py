"""Flakes named, not fatal: the FLAKY list of a run.

pytest-rerunfailures runs a failed test once more (`--reruns 1` in pyproject's addopts). A test
that then passes is a flake: it does not turn the run red, but it is named at the end of the
run under "FLAKY", with the output of its first failure, so that it is mended at its cause
rather than forgotten. A test that fails twice is an ordinary failure and is not listed.

With `$RBROKER_FLAKY_FILE` set (`.ci/run` sets it), each flake is also appended to that file
as one JSON object a line, `{"set": str, "nodeid": str, "first_failure": str}`, so that the
run's closing lines can list the flakes of every test set (Linux, Windows under Wine, the
cross-platform pairs) together.

Under pytest-xdist the reports reach the controller, which alone keeps the list.
"""

from __future__ import annotations

import json
import os
import platform

import pytest

FLAKY_FILE_ENV = "RBROKER_FLAKY_FILE"
"""The environment variable naming the file each flake is appended to (JSON lines)."""

FIRST_FAILURE_LINES = 120
"""How many of the last lines of a flake's first failure are kept, for the terminal and for
the flaky file that `.ci/run`'s summary prints whole."""


def _last_lines(text: str) -> str:
    """The last FIRST_FAILURE_LINES lines of `text`, after a line counting those left out."""
    lines = text.splitlines()
    if len(lines) <= FIRST_FAILURE_LINES:
        return text
    left_out = len(lines) - FIRST_FAILURE_LINES
    return "\n".join([f"... ({left_out} lines above left out)", *lines[-FIRST_FAILURE_LINES:]])


class FlakyList:
    """Reruns and final outcomes by test id; `flakes()` is what reran and then passed."""

    def __init__(self) -> None:
        self.first_failure: dict[str, str] = {}
        self.failed: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.outcome == "rerun":
            if report.nodeid not in self.first_failure:
                self.first_failure[report.nodeid] = _failure_text(report)
        elif report.failed:
            self.failed.add(report.nodeid)

    def flakes(self) -> list[tuple[str, str]]:
        """(node id, first failure's text) of each test that reran and did not fail again,
        in the order they first failed."""
        return [
            (n, _last_lines(text)) for n, text in self.first_failure.items() if n not in self.failed
        ]

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        flakes = self.flakes()
        if not flakes:
            return
        tr = terminalreporter
        tr.section(f"FLAKY ({len(flakes)}): failed once, passed on the rerun", sep="=")
        for nodeid, text in flakes:
            tr.write_line(f"FLAKY {nodeid}")
            for line in text.splitlines():
                tr.write_line(f"    {line}")
        path = os.environ.get(FLAKY_FILE_ENV)
        if path:
            label = "Windows" if platform.system() == "Windows" else platform.system()
            with open(path, "a", encoding="utf-8") as out:
                for nodeid, text in flakes:
                    row = {"set": label, "nodeid": nodeid, "first_failure": text}
                    out.write(json.dumps(row) + "\n")


def _failure_text(report: pytest.TestReport) -> str:
    """The failure as pytest would print it, with the captured output after it."""
    parts = [f"(in {report.when})", report.longreprtext]
    for title, content in report.sections:
        parts.append(f"--- {title} ---\n{content}")
    return "\n".join(parts)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: its reports go to the controller
        return
    config.pluginmanager.register(FlakyList(), "rbroker-flaky-list")

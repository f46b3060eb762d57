"""Windows processes under Wine, started from a Linux test and all stopped at its end.

`WineProcesses.start(args)` runs `.ci/wine python ARGS…` (`tests.windows.wine.win_python`) in
a new session, so that the shell, Wine's loader and the Windows python are one process group
that `stop_all()` kills with SIGKILL (never `wineserver -k`: the Wine prefix is shared). A
thread reads each one's output as it comes (an unread pipe would block a chatty broker).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.windows.wine import win_python

ENV = {"COLUMNS": "1000", "PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8"}
"""A terminal width that keeps rich from wrapping the lines tests look for; output unbuffered
(a pipe is block-buffered) and in UTF-8 (else the ANSI code page, cp1252 under Wine)."""


@dataclass
class WineProcess:
    """One running `.ci/wine python ARGS…` and the output it printed so far."""

    args: list[str]
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout_s: float) -> None:
        """Wait until `text` appears in the output.

        Raises:
            AssertionError: the process exited first or `timeout_s` passed (with its output).
        """
        deadline = time.monotonic() + timeout_s
        while text not in self.output:
            if self.proc.poll() is not None:
                time.sleep(0.2)  # the reader thread's last lines
                if text in self.output:
                    return
                raise AssertionError(
                    f"{self.args} exited ({self.proc.returncode}) before {text!r}:\n{self.output}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.args}: no {text!r} in {timeout_s:g} s:\n{self.output}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the process group (shell, Wine loader, Windows python); wait for it."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.reader.join(5)
        if not self.reader.is_alive() and self.proc.stdout is not None:
            self.proc.stdout.close()


class WineProcesses:
    """The Windows processes of one test."""

    def __init__(self) -> None:
        self.started: list[WineProcess] = []

    def start(self, args: list[str], env: dict[str, str] | None = None) -> WineProcess:
        """Start `.ci/wine python ARGS…` (output piped and collected)."""
        proc = win_python(
            args, env={**ENV, **(env or {})}, start_new_session=True, errors="replace"
        )
        wp = WineProcess(args, proc)
        self.started.append(wp)
        return wp

    def run(
        self, args: list[str], timeout_s: float = 120, env: dict[str, str] | None = None
    ) -> tuple[int, str]:
        """Run `.ci/wine python ARGS…` to its end; returns its exit code and output.

        Raises:
            AssertionError: it did not end within `timeout_s` (it is killed, with its output).
        """
        wp = self.start(args, env)
        try:
            code = wp.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            wp.kill()
            raise AssertionError(f"{args}: not done in {timeout_s:g} s:\n{wp.output}") from None
        wp.reader.join(5)  # the last lines
        return code, wp.output

    def stop_all(self) -> None:
        for wp in reversed(self.started):
            wp.kill()


@pytest.fixture
def wine_procs() -> Iterator[WineProcesses]:
    """`wine_procs.start(args)` / `.run(args)`: Windows processes killed at teardown."""
    procs = WineProcesses()
    yield procs
    procs.stop_all()

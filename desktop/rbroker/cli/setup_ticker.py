"""Lines that say what a command is doing while it sets up, so a slow machine is never
silent (`rbroker demo`)."""

from __future__ import annotations

import threading
import time

from rich.console import Console

SETUP_TICK_S = 3.0
"""While the demo sets up, a line at least this often says what it is doing."""


class SetupTicker:
    """Says what the demo is doing while it sets up: `step(text)` prints `text` at once and,
    while the step lasts, `  … still TEXT (N s)` every `SETUP_TICK_S`, so a slow machine is
    never silent; `done()` stops it."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._text = ""
        self._since = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-setup-ticker", daemon=True)
        self._thread.start()

    def step(self, text: str) -> None:
        with self._lock:
            self._text, self._since = text, time.monotonic()
            self._console.print(text, soft_wrap=not self._console.is_terminal, highlight=False)

    def _run(self) -> None:
        while not self._stop.wait(SETUP_TICK_S):
            with self._lock:
                if self._text and not self._stop.is_set():
                    waited = time.monotonic() - self._since
                    self._console.print(
                        f"  … still {self._text[:1].lower()}{self._text[1:].rstrip('.…')} "
                        f"({waited:.0f} s)",
                        soft_wrap=not self._console.is_terminal,
                        highlight=False,
                    )

    def done(self) -> None:
        with self._lock:
            self._stop.set()
            self._text = ""
        self._thread.join(5)

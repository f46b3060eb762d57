"""The order of this computer's broker runs: a counter kept in the broker's data dir.

Every new run (each broker start, and each new run id the reporter starts) takes the next
value and sends it in its reports (`run_counter`, report version 2), so the coordinator can
refuse a report of an older run that arrives late instead of letting it replace the current
run (`run_outdated`). The file is `<data dir>/run_counter`: one decimal integer, replaced
atomically, mode 0600 whatever the umask (`rbroker_protocol.files.private_replace`). A
missing or unreadable file counts as 0; a value that cannot be written is used anyway (the
coordinator's `run_outdated` answer then says which value to continue above).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from rbroker_protocol.files import private_replace

log = logging.getLogger(__name__)

FILE_NAME = "run_counter"


class RunCounter:
    """`next()` → the next run counter of the computer whose data dir is `data_dir`."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / FILE_NAME
        self._lock = threading.Lock()
        self._last = 0

    def current(self) -> int:
        """The last value handed out (read from the file; 0 when there is none)."""
        try:
            text = self.path.read_text(encoding="ascii").strip()
            value = int(text)
        except FileNotFoundError:
            return self._last
        except (OSError, ValueError) as exc:
            log.warning("run counter %s unreadable (%s); counting from %d", self.path, exc, 0)
            return self._last
        return max(value, self._last) if value >= 0 else self._last

    def next(self, above: int | None = None) -> int:
        """Take the next value: one above both the stored value and `above` (the current
        run counter the coordinator answered with `run_outdated`), stored before use."""
        with self._lock:
            value = max(self.current(), above or 0) + 1
            self._last = value
            try:
                private_replace(self.path, f"{value}\n".encode("ascii"))
            except OSError as exc:
                log.warning("cannot store run counter %d in %s: %s", value, self.path, exc)
            return value

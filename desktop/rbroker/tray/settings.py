"""The tray's own settings: a small JSON file in the user config dir. No Qt here."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import platformdirs

from rbroker_protocol.files import private_replace

log = logging.getLogger(__name__)


def settings_path() -> Path:
    """`<user config dir>/rbroker/tray.json`."""
    return Path(platformdirs.user_config_dir("rbroker", appauthor=False)) / "tray.json"


@dataclass
class TraySettings:
    """What the Settings tab edits.

    `headroom_mib=None` keeps the broker default max(512 MiB, 5 %); it applies to a broker
    the tray starts itself (from its next start). `coordinator_url` is where enrollment
    goes (the uplink reads it).
    """

    coordinator_url: str = ""
    headroom_mib: int | None = None

    @classmethod
    def load(cls, path: Path | None = None) -> TraySettings:
        """The saved settings, or the defaults when the file is missing or unreadable."""
        path = path or settings_path()
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable tray settings %s: %s", path, exc)
            return cls()
        known = {f.name for f in fields(cls)}
        out = cls(**{k: v for k, v in raw.items() if k in known})
        if out.headroom_mib is not None and (
            not isinstance(out.headroom_mib, int) or out.headroom_mib < 0
        ):
            out.headroom_mib = None
        if not isinstance(out.coordinator_url, str):
            out.coordinator_url = ""
        return out

    def save(self, path: Path | None = None) -> None:
        """Write atomically, mode 0600 in a 0700 folder whatever the umask
        (`rbroker_protocol.files.private_replace`: a umask of 002 left a group-writable
        settings file, whose coordinator URL another account could change). Raises `OSError`."""
        path = path or settings_path()
        private_replace(path, (json.dumps(asdict(self), indent=2) + "\n").encode("utf-8"))

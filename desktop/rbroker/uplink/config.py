"""The uplink settings of one broker, kept in `<data dir>/uplink.json` (no secrets)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

FILE_NAME = "uplink.json"


@dataclass(frozen=True, slots=True)
class UplinkConfig:
    """Where this computer reports and who it is there.

    `key_backend` is `keyring` or `file`; `ca_file` pins the coordinator's CA (PEM) for
    self-signed deployments; `report_interval_s` is the snapshot period (architecture.md §7: 5 s).
    `extra` holds the keys of `uplink.json` this version does not know (written by a newer
    one sharing the data dir): they are kept and written back unchanged by `save`.
    """

    url: str
    computer_id: str
    group: str
    name: str
    key_backend: str = "keyring"
    ca_file: str | None = None
    report_interval_s: float = 5.0
    extra: dict[str, Any] = field(default_factory=dict)

    def save(self, data_dir: Path) -> None:
        """Write atomically: the known settings, then the unknown keys kept in `extra`."""
        data_dir.mkdir(parents=True, exist_ok=True)
        known = asdict(self)
        known.pop("extra")
        data = {**{k: v for k, v in self.extra.items() if k not in known}, **known}
        tmp = data_dir / (FILE_NAME + ".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, data_dir / FILE_NAME)

    @classmethod
    def load(cls, data_dir: Path) -> UplinkConfig | None:
        """The saved config, or None when this computer is not enrolled. Keys this
        version does not know are kept in `extra`.

        Raises:
            ValueError: the file exists but is not a valid config (not a JSON object, a
                required key missing).
        """
        try:
            raw = json.loads((data_dir / FILE_NAME).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ValueError(f"{data_dir / FILE_NAME} is unreadable: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{data_dir / FILE_NAME} is not an uplink config: not an object")
        names = {f.name for f in fields(cls)} - {"extra"}
        known = {k: v for k, v in raw.items() if k in names}
        extra = {k: v for k, v in raw.items() if k not in names}
        try:
            return cls(**known, extra=extra)
        except TypeError as exc:
            raise ValueError(f"{data_dir / FILE_NAME} is not an uplink config: {exc}") from None

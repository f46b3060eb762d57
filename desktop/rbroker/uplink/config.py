"""The uplink settings of one broker, kept in `<data dir>/uplink.json` (no secrets)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

FILE_NAME = "uplink.json"


@dataclass(frozen=True, slots=True)
class UplinkConfig:
    """Where this computer reports and who it is there.

    `key_backend` is `keyring` or `file`; `ca_file` pins the coordinator's CA (PEM) for
    self-signed deployments; `report_interval_s` is the snapshot period (DESIGN §7: 5 s).
    """

    url: str
    computer_id: str
    group: str
    name: str
    key_backend: str = "keyring"
    ca_file: str | None = None
    report_interval_s: float = 5.0

    def save(self, data_dir: Path) -> None:
        """Write atomically."""
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = data_dir / (FILE_NAME + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, data_dir / FILE_NAME)

    @classmethod
    def load(cls, data_dir: Path) -> UplinkConfig | None:
        """The saved config, or None when this computer is not enrolled.

        Raises:
            ValueError: the file exists but is not a valid config.
        """
        try:
            raw = json.loads((data_dir / FILE_NAME).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ValueError(f"{data_dir / FILE_NAME} is unreadable: {exc}") from None
        try:
            return cls(**raw)
        except TypeError as exc:
            raise ValueError(f"{data_dir / FILE_NAME} is not an uplink config: {exc}") from None

"""The uplink settings of one broker, kept in `<data dir>/uplink.json` (no secrets).

The file says where the broker sends its signed reports (every user's leases on this
computer), so it is written 0600 whatever the umask and read only when no other account
could have written it (POSIX; on Windows the data folder's ACL keeps others out).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from rbroker_protocol.files import private_replace, unsafe_file

FILE_NAME = "uplink.json"


class UnsafeEnrollment(ValueError):
    """`uplink.json` could have been written by another account (its group or others may
    write it, or another non-root account owns it): refused, as anyone who can write it can
    send this computer's reports to a listener of their own. The message is one line naming
    the file, its mode and owner, and the fix. A ValueError, so every reader that reports an
    unreadable config reports this one too."""


def read_enrollment_file(path: Path) -> str:
    """The text of `path`, an enrollment file (`uplink.json`, `computer.key`), after checking
    on the open file that no other account could have written it (`unsafe_file`).

    Raises:
        FileNotFoundError: no such file.
        UnsafeEnrollment: another account could have written it (one line with the fix).
        OSError: it cannot be read; UnicodeDecodeError: it is not UTF-8.
    """
    with open(path, encoding="utf-8") as f:
        unsafe = unsafe_file(path, os.fstat(f.fileno()))
        if unsafe is not None:
            raise UnsafeEnrollment(
                f"refusing to read {path}: {unsafe.problem}, so it may send this computer's "
                f"reports to someone else's listener; fix: {unsafe.fix}"
            )
        return f.read()


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
        """Write atomically: the known settings, then the unknown keys kept in `extra`. The
        file is 0600 in a data dir made 0700 when missing (`private_replace`), whatever the
        umask.

        Raises:
            OSError: the data dir or the file cannot be written.
        """
        known = asdict(self)
        known.pop("extra")
        data = {**{k: v for k, v in self.extra.items() if k not in known}, **known}
        private_replace(data_dir / FILE_NAME, (json.dumps(data, indent=2) + "\n").encode())

    @classmethod
    def load(cls, data_dir: Path) -> UplinkConfig | None:
        """The saved config, or None when this computer is not enrolled. Keys this
        version does not know are kept in `extra`.

        Raises:
            UnsafeEnrollment: another account could have written the file (POSIX).
            ValueError: the file exists but is not a valid config (not a JSON object, a
                required key missing).
        """
        try:
            raw = json.loads(read_enrollment_file(data_dir / FILE_NAME))
        except FileNotFoundError:
            return None
        except UnsafeEnrollment:
            raise
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

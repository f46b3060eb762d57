"""Keyring backends for tests, chosen with `PYTHON_KEYRING_BACKEND=tests.e2e.keyring_backends.X`.

`FileBackedKeyring` keeps passwords in the JSON file named by `RBROKER_TEST_KEYRING_FILE`
(a stand-in for an OS keyring that works across processes); `HangingKeyring` never answers
(a locked Secret Service waiting for a prompt nobody sees).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from keyring.backend import KeyringBackend
from keyring.errors import PasswordDeleteError

HANG_S = 3600.0


class FileBackedKeyring(KeyringBackend):
    priority = 10  # type: ignore[assignment]

    def _path(self) -> Path:
        return Path(os.environ["RBROKER_TEST_KEYRING_FILE"])

    def _read(self) -> dict[str, str]:
        try:
            return dict(json.loads(self._path().read_text()))
        except FileNotFoundError:
            return {}

    def get_password(self, service: str, username: str) -> str | None:
        return self._read().get(f"{service}/{username}")

    def set_password(self, service: str, username: str, password: str) -> None:
        data = self._read()
        data[f"{service}/{username}"] = password
        self._path().write_text(json.dumps(data))

    def delete_password(self, service: str, username: str) -> None:
        data = self._read()
        if data.pop(f"{service}/{username}", None) is None:
            raise PasswordDeleteError(username)
        self._path().write_text(json.dumps(data))


class HangingKeyring(KeyringBackend):
    priority = 10  # type: ignore[assignment]

    def get_password(self, service: str, username: str) -> str | None:
        time.sleep(HANG_S)
        return None

    def set_password(self, service: str, username: str, password: str) -> None:
        time.sleep(HANG_S)

    def delete_password(self, service: str, username: str) -> None:
        time.sleep(HANG_S)

"""Keyring backends for tests, chosen with `PYTHON_KEYRING_BACKEND=tests.e2e.keyring_backends.X`.

`EncryptedFileKeyring` stands in for an OS keyring that works across processes: it keeps
passwords encrypted (NaCl SecretBox) in the JSON file named by `RBROKER_TEST_KEYRING_FILE`,
else in `~/.rbroker-test-keyring.json` of the account it runs as (so another OS account
sees its own, empty, keyring). `LowPriorityKeyring` is the same store at priority 0.5 (a
fallback keyring.backend would pick only when nothing better exists). `HighPriorityPlaintext`
is keyrings.alt's PlaintextKeyring claiming priority 5. `HangingKeyring` never answers (a
locked Secret Service waiting for a prompt nobody sees).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from pathlib import Path

import nacl.secret
from keyring.backend import KeyringBackend
from keyring.errors import PasswordDeleteError
from keyrings.alt.file import PlaintextKeyring

HANG_S = 3600.0
_BOX = nacl.secret.SecretBox(hashlib.sha256(b"rbroker test keyring").digest())
ENCRYPTED_PREFIX = "secretbox:"


class EncryptedFileKeyring(KeyringBackend):
    priority = 10  # type: ignore[assignment]
    name = "rbroker test keyring (encrypted)"  # type: ignore[assignment]

    def _path(self) -> Path:
        env = os.environ.get("RBROKER_TEST_KEYRING_FILE")
        return Path(env) if env else Path.home() / ".rbroker-test-keyring.json"

    def _read(self) -> dict[str, str]:
        try:
            return dict(json.loads(self._path().read_text()))
        except FileNotFoundError:
            return {}

    def get_password(self, service: str, username: str) -> str | None:
        sealed = self._read().get(f"{service}/{username}")
        if sealed is None:
            return None
        return _BOX.decrypt(base64.b64decode(sealed.removeprefix(ENCRYPTED_PREFIX))).decode()

    def set_password(self, service: str, username: str, password: str) -> None:
        data = self._read()
        sealed = base64.b64encode(_BOX.encrypt(password.encode())).decode()
        data[f"{service}/{username}"] = ENCRYPTED_PREFIX + sealed
        self._path().write_text(json.dumps(data))

    def delete_password(self, service: str, username: str) -> None:
        data = self._read()
        if data.pop(f"{service}/{username}", None) is None:
            raise PasswordDeleteError(username)
        self._path().write_text(json.dumps(data))


class LowPriorityKeyring(EncryptedFileKeyring):
    priority = 0.5  # type: ignore[assignment]
    name = "rbroker test keyring (low priority)"  # type: ignore[assignment]


class HighPriorityPlaintext(PlaintextKeyring):
    priority = 5  # type: ignore[assignment]


class HangingKeyring(KeyringBackend):
    priority = 10  # type: ignore[assignment]

    def get_password(self, service: str, username: str) -> str | None:
        time.sleep(HANG_S)
        return None

    def set_password(self, service: str, username: str, password: str) -> None:
        time.sleep(HANG_S)

    def delete_password(self, service: str, username: str) -> None:
        time.sleep(HANG_S)

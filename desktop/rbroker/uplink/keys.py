"""Where a computer's Ed25519 private key lives (DESIGN §7).

The OS keyring (keyring package) by default. Where no usable keyring backend exists (a
headless Linux server), storing the key needs an explicit choice of a 0600 file in the
data dir (`--key-file`): never a silent plaintext fallback. A keyring call that hangs (a
locked Secret Service waiting for a prompt nobody answers) is cut off after a few seconds.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

import nacl.signing

KEYRING_SERVICE = "rbroker"
KEYRING_TIMEOUT_S = 5.0

T = TypeVar("T")


class KeyStoreError(RuntimeError):
    """The key cannot be stored or read; the message names the store and the fix."""


class KeyStore(Protocol):
    """One place a private key can live."""

    description: str

    def load(self) -> nacl.signing.SigningKey | None:
        """The stored key, or None when nothing is stored. Raises KeyStoreError."""

    def save(self, key: nacl.signing.SigningKey) -> None:
        """Store `key`, replacing nothing: raises KeyStoreError if one is stored."""

    def delete(self) -> None:
        """Remove the stored key (used only to undo a failed enrollment)."""


def _encode(key: nacl.signing.SigningKey) -> str:
    return base64.b64encode(bytes(key)).decode("ascii")


def _decode(text: str, where: str) -> nacl.signing.SigningKey:
    try:
        seed = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise KeyStoreError(f"the key in {where} is not valid base64") from None
    if len(seed) != 32:
        raise KeyStoreError(f"the key in {where} is not a 32-byte Ed25519 seed")
    return nacl.signing.SigningKey(seed)


_stuck: tuple[threading.Thread, float] | None = None
"""The latest keyring call and when it started: while one is past its deadline and still
running, new calls fail at once instead of piling up threads that never return."""
_stuck_lock = threading.Lock()


def _bounded(fn: Callable[[], T], what: str) -> T:
    """`fn()` on a daemon thread, given up after `KEYRING_TIMEOUT_S`.

    A daemon thread, not a pool: a call that never returns must not keep the process
    from exiting (a pool's worker is joined at interpreter exit).
    """
    global _stuck
    outcome: list[tuple[bool, object]] = []

    def call() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the caller below
            outcome.append((False, exc))

    thread = threading.Thread(target=call, name="keyring", daemon=True)
    with _stuck_lock:
        if (
            _stuck is not None
            and _stuck[0].is_alive()
            and time.monotonic() - _stuck[1] > KEYRING_TIMEOUT_S
        ):
            raise KeyStoreError(
                f"the OS keyring did not answer within {KEYRING_TIMEOUT_S:g} s and has not "
                f"answered since ({what} not tried); unlock it or use --key-file"
            )
        _stuck = (thread, time.monotonic())
    thread.start()
    thread.join(KEYRING_TIMEOUT_S)
    if not outcome:
        raise KeyStoreError(
            f"the OS keyring did not answer within {KEYRING_TIMEOUT_S:g} s ({what}); unlock it "
            "or use --key-file"
        )
    ok, value = outcome[0]
    if ok:
        return value  # type: ignore[return-value]
    import keyring.errors

    if isinstance(value, keyring.errors.KeyringError) and not isinstance(
        value, keyring.errors.PasswordDeleteError
    ):
        raise KeyStoreError(f"the OS keyring failed ({what}): {value}; or use --key-file")
    raise value  # type: ignore[misc]


def keyring_usable() -> tuple[bool, str]:
    """Whether a real keyring backend exists, and its name (or why not)."""
    try:
        import keyring
        import keyring.backends.fail
    except ImportError:  # pragma: no cover - keyring is a base dependency
        return False, "the keyring package is missing"
    backend = _bounded(keyring.get_keyring, "finding a backend")
    if isinstance(backend, keyring.backends.fail.Keyring) or getattr(backend, "priority", 1) <= 0:
        return False, "no OS keyring backend is available (headless machine?)"
    return True, type(backend).__name__


class KeyringKeyStore:
    """The key in the OS keyring, under service `rbroker`, one account per data dir."""

    def __init__(self, data_dir: Path) -> None:
        digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:16]
        self.account = f"computer-key-{digest}"
        self.description = f"the OS keyring (service {KEYRING_SERVICE}, account {self.account})"

    def _check(self) -> None:
        ok, why = keyring_usable()
        if not ok:
            raise KeyStoreError(
                f"cannot use the OS keyring: {why}. Install and unlock a keyring (Secret "
                "Service, KWallet, Windows Credential Manager, macOS Keychain), or pass "
                "--key-file to keep the key in a 0600 file in the data dir"
            )

    def load(self) -> nacl.signing.SigningKey | None:
        import keyring

        self._check()
        text = _bounded(lambda: keyring.get_password(KEYRING_SERVICE, self.account), "read")
        return None if text is None else _decode(text, self.description)

    def save(self, key: nacl.signing.SigningKey) -> None:
        import keyring

        if self.load() is not None:
            raise KeyStoreError(f"{self.description} already holds a key; not replacing it")
        _bounded(lambda: keyring.set_password(KEYRING_SERVICE, self.account, _encode(key)), "write")

    def delete(self) -> None:
        import keyring
        import keyring.errors

        with contextlib.suppress(keyring.errors.PasswordDeleteError):
            _bounded(lambda: keyring.delete_password(KEYRING_SERVICE, self.account), "delete")


class FileKeyStore:
    """The key as base64 in a file of mode 0600 in the data dir (explicitly chosen)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.description = f"the key file {path} (mode 0600)"

    def load(self) -> nacl.signing.SigningKey | None:
        try:
            text = self.path.read_text(encoding="ascii")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise KeyStoreError(f"cannot read {self.path}: {exc.strerror}") from None
        if os.name == "posix" and self.path.stat().st_mode & 0o077:
            raise KeyStoreError(f"{self.path} is readable by others; chmod 600 it")
        return _decode(text, self.description)

    def save(self, key: nacl.signing.SigningKey) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise KeyStoreError(f"{self.path} already exists; not replacing it") from None
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(_encode(key) + "\n")

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)


def key_store(data_dir: Path, backend: str) -> KeyStore:
    """The store named in the uplink config: `keyring` or `file`."""
    if backend == "file":
        return FileKeyStore(data_dir / "computer.key")
    return KeyringKeyStore(data_dir)

"""Where a computer's Ed25519 private key lives (docs/architecture.md §7).

The OS keyring (keyring package) by default, but only a backend that keeps secrets in an OS
facility or encrypted (Windows Credential Manager, macOS Keychain, Secret Service, KWallet):
keyring's own fallbacks (keyrings.alt's plaintext and file backends, the null and fail
backends, anything of priority below 1) are refused with the same message as "no keyring",
naming `--key-file`, the explicit choice of a 0600 file in the data dir. A key found in a
plaintext backend is never used. A keyring call that hangs (a locked Secret Service waiting
for a prompt nobody answers) is cut off after a few seconds.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import stat
import sys
from pathlib import Path
from typing import Any, Protocol, TypeVar

import nacl.signing

from rbroker.uplink.keyrings import (
    ACCEPTED_TEXT,
    KeyringChoice,
    KeyStoreError,
    backend_name,
    bounded,
    choose_keyring,
    os_account,
    plaintext_stores,
)
from rbroker_protocol.files import private_create, unsafe_file

KEYRING_SERVICE = "rbroker"

T = TypeVar("T")


class KeyStore(Protocol):
    """One place a private key can live."""

    @property
    def description(self) -> str:
        """Where the key is, as far as known without asking the store again."""

    def load(self) -> nacl.signing.SigningKey | None:
        """The stored key, or None when nothing is stored. Raises KeyStoreError."""

    def save(self, key: nacl.signing.SigningKey) -> None:
        """Store `key`, replacing nothing: raises KeyStoreError if one is stored."""

    def delete(self) -> None:
        """Remove the stored key (used only to undo a failed enrollment)."""

    def where(self) -> str:
        """Where the key is, for people: the backend's name or the file's path and mode.
        Raises KeyStoreError (the keyring cannot be asked)."""

    def missing_message(self) -> str:
        """Why `load()` found nothing, where it looked, as which OS account, and the fix."""


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


class PlaintextKeyError(KeyStoreError):
    """The key was found in a plaintext keyring backend: never used; re-enroll."""


class KeyringKeyStore:
    """The key in the OS keyring, under service `rbroker`, one entry per data dir.

    Only a backend that `judge` accepts is used; a key found in a plaintext backend (put
    there before this check existed) raises `PlaintextKeyError` and is never used.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:16]
        self.account = f"computer-key-{digest}"
        self.os_account = os_account()
        self.choice: KeyringChoice | None = None

    @property
    def description(self) -> str:
        """Where the key is: the backend's name (once asked), the OS account, the entry."""
        where = self.choice.name if self.choice is not None else "the OS keyring"
        return (
            f"{where} of OS account {self.os_account} (service {KEYRING_SERVICE}, entry "
            f"{self.account})"
        )

    def where(self) -> str:
        """`description` after asking keyring for its backend. Raises KeyStoreError."""
        self._backend()
        return self.description

    def _fix(self) -> str:
        return (
            f"Install and unlock an OS keyring for {self.os_account} ({ACCEPTED_TEXT}), or "
            "enroll with --key-file to keep the key in a 0600 file in the data dir "
            f"({self.data_dir}; add --new-identity when it is enrolled already)"
        )

    def _backend(self) -> Any:
        """The accepted backend. Raises KeyStoreError naming the refusal and the fix."""
        self.choice = None
        self.choice = choose_keyring()
        if self.choice.refusal is not None:
            raise KeyStoreError(
                f"cannot use the OS keyring of OS account {self.os_account}: "
                f"{self.choice.refusal}. {self._fix()}"
            )
        return self.choice.backend

    def _get(self, backend: Any) -> str | None:
        got = bounded(
            lambda: backend.get_password(KEYRING_SERVICE, self.account),
            f"read, OS account {self.os_account}",
        )
        return None if got is None else str(got)

    def plaintext_copies(self) -> list[str]:
        """Where an unencrypted copy of this entry sits (file paths); read-only."""
        found = []
        for backend in plaintext_stores(self.choice):
            with contextlib.suppress(Exception):  # an unreadable file holds nothing for us
                if backend.get_password(KEYRING_SERVICE, self.account) is not None:
                    found.append(str(getattr(backend, "file_path", backend_name(backend))))
        return found

    def forget_plaintext_copies(self) -> list[str]:
        """Delete this entry from plaintext backends (after a new identity replaced it);
        returns the files it was removed from."""
        removed = []
        for backend in plaintext_stores(self.choice):
            with contextlib.suppress(Exception):
                if backend.get_password(KEYRING_SERVICE, self.account) is not None:
                    backend.delete_password(KEYRING_SERVICE, self.account)
                    removed.append(str(getattr(backend, "file_path", backend_name(backend))))
        return removed

    def _plaintext_error(self) -> PlaintextKeyError | None:
        copies = self.plaintext_copies()
        if not copies:
            return None
        return PlaintextKeyError(
            f"the private key sits unencrypted in {', '.join(copies)} (a plaintext keyring "
            "backend); rbroker does not use it. Enroll again with --new-identity into an OS "
            "keyring, or with --key-file --new-identity for a 0600 file in the data dir "
            f"({self.data_dir}); the unencrypted copy is removed then, and the old computer "
            "can be revoked on the coordinator"
        )

    def load(self) -> nacl.signing.SigningKey | None:
        try:
            backend = self._backend()
        except KeyStoreError:
            if self.choice is not None and self.choice.refusal is not None:
                plain = self._plaintext_error()
                if plain is not None:
                    raise plain from None
            raise
        text = self._get(backend)
        if text is None:
            plain = self._plaintext_error()
            if plain is not None:
                raise plain
            return None
        return _decode(text, self.description)

    def missing_message(self) -> str:
        """What to say when `load()` found no key: where it looked, as whom, and the fix."""
        return (
            f"the private key is not in {self.description}. A broker finds it only in the "
            f"keyring of the OS account it runs as ({self.os_account}): enroll as "
            f"{self.os_account} (rbroker enroll URL CODE --data-dir {self.data_dir} "
            "--new-identity), or enroll with --key-file --new-identity --data-dir "
            f"{self.data_dir} to keep the key in a 0600 file in the broker's data dir"
        )

    def save(self, key: nacl.signing.SigningKey) -> None:
        backend = self._backend()
        if self._get(backend) is not None:
            raise KeyStoreError(f"{self.description} already holds a key; not replacing it")
        bounded(
            lambda: backend.set_password(KEYRING_SERVICE, self.account, _encode(key)),
            f"write, OS account {self.os_account}",
        )

    def delete(self) -> None:
        import keyring.errors

        backend = self._backend()
        with contextlib.suppress(keyring.errors.PasswordDeleteError):
            bounded(
                lambda: backend.delete_password(KEYRING_SERVICE, self.account),
                f"delete, OS account {self.os_account}",
            )


class KeyUnreadable(KeyStoreError):
    """The key file exists but this OS account may not read it; `owner` is the account it
    belongs to (None where that cannot be told). The message carries the broker's fix (run
    it as the owner, or chown the file to this account); a reader that is not the broker
    (`rbroker fleet` on a shared server) gives its own, never that chown."""

    def __init__(self, message: str, owner: str | None) -> None:
        super().__init__(message)
        self.owner = owner


def _file_owner(path: Path) -> str | None:
    if sys.platform == "win32":  # no numeric owners to name; the path says enough
        return None
    import pwd

    try:
        return pwd.getpwuid(path.stat().st_uid).pw_name
    except (KeyError, OSError):
        return None


def _owner_hint(owner: str | None) -> str:
    """`; it belongs to OWNER: ...` for a key file the broker's account may not read."""
    if owner is None:
        return ""
    return (
        f"; it belongs to {owner}: run the broker as {owner}, or chown the file (and the data "
        f"dir) to {os_account()}, keeping mode 0600"
    )


class FileKeyStore:
    """The key as base64 in a file of mode 0600 in the data dir (explicitly chosen)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.description = f"the key file {path} (mode 0600)"

    def load(self) -> nacl.signing.SigningKey | None:
        """The key in the file, or None when there is no file.

        Raises:
            KeyUnreadable: this OS account may not read it.
            KeyStoreError: it cannot be read, or is not a key; on POSIX also when another
                account could have written it (group or others may write it, or another
                non-root account owns it: `unsafe_file`, one line with the fix) or others
                may read it.
        """
        try:
            f = open(self.path, encoding="ascii")  # noqa: SIM115 (closed below)
        except FileNotFoundError:
            return None
        except PermissionError as exc:
            owner = _file_owner(self.path)
            raise KeyUnreadable(
                f"cannot read {self.path} as OS account {os_account()}: {exc.strerror}"
                f"{_owner_hint(owner)}",
                owner,
            ) from None
        except OSError as exc:
            raise KeyStoreError(f"cannot read {self.path}: {exc.strerror}") from None
        with f:
            st = os.fstat(f.fileno())  # the file read, not whatever the name means later
            unsafe = unsafe_file(self.path, st)
            if unsafe is not None:
                raise KeyStoreError(
                    f"refusing to read {self.path}: {unsafe.problem}, so it may hold a key "
                    f"someone else chose; fix: {unsafe.fix}"
                )
            if os.name == "posix" and st.st_mode & 0o077:
                raise KeyStoreError(f"{self.path} is readable by others; chmod 600 it")
            try:
                text = f.read()
            except (OSError, ValueError) as exc:
                raise KeyStoreError(f"cannot read {self.path}: {exc}") from None
        return _decode(text, self.description)

    def save(self, key: nacl.signing.SigningKey) -> None:
        """Create the file, 0600 in a data dir made 0700 when missing, whatever the umask
        (`private_create`: never replacing a file, never following a link).

        Raises:
            KeyStoreError: a file is there already, or it cannot be written.
        """
        try:
            private_create(self.path, (_encode(key) + "\n").encode("ascii"))
        except FileExistsError:
            raise KeyStoreError(f"{self.path} already exists; not replacing it") from None
        except OSError as exc:
            raise KeyStoreError(f"cannot write {self.path}: {exc.strerror}") from None

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)

    def where(self) -> str:
        try:
            mode = stat.S_IMODE(self.path.stat().st_mode)
        except OSError:
            return f"the key file {self.path} (missing)"
        return f"the key file {self.path} (mode {mode:04o})"

    def missing_message(self) -> str:
        return (
            f"the key file {self.path} is missing (this broker runs as OS account "
            f"{os_account()}): restore it, or enroll again with --key-file --new-identity "
            f"--data-dir {self.path.parent}"
        )


def key_store(data_dir: Path, backend: str) -> KeyStore:
    """The store named in the uplink config: `keyring` or `file`."""
    if backend == "file":
        return FileKeyStore(data_dir / "computer.key")
    return KeyringKeyStore(data_dir)

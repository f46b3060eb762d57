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
import getpass
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import nacl.signing

KEYRING_SERVICE = "rbroker"
KEYRING_TIMEOUT_S = 5.0

T = TypeVar("T")


class KeyStoreError(RuntimeError):
    """The key cannot be stored or read; the message names the store and the fix."""


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


def os_account() -> str:
    """The OS account this process runs as (effective uid on POSIX): whose keyring it asks."""
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        try:
            return getpass.getuser()
        except (OSError, KeyError):  # no name for this uid (a container's arbitrary uid)
            return f"uid {os.geteuid()}" if hasattr(os, "geteuid") else "unknown"


MIN_PRIORITY = 1.0
"""keyring's own mark: "a priority between zero but less than one is suitable, but a priority
of one or greater is recommended" (keyring.backend.KeyringBackend.priority). Backends below 1
are the fallbacks nobody chose: keyrings.alt's files (0.5, 0.6), the null and fail backends."""

OS_BACKENDS = {
    "keyring.backends.Windows.WinVaultKeyring": "Windows Credential Manager",
    "keyring.backends.macOS.Keyring": "macOS Keychain",
    "keyring.backends.SecretService.Keyring": "Secret Service",
    "keyring.backends.libsecret.Keyring": "Secret Service (libsecret)",
    "keyring.backends.kwallet.DBusKeyringKWallet4": "KWallet 4",
    "keyring.backends.kwallet.DBusKeyring": "KWallet",
    "keyrings.alt.Windows.RegistryKeyring": "the Windows registry, DPAPI-encrypted (keyrings.alt)",
}
"""Human names of the backends that keep secrets in an OS facility, by class path."""

REFUSED_BACKENDS = {
    "keyring.backends.fail.Keyring": "no OS keyring backend is available (headless machine?)",
    "keyring.backends.null.Keyring": "the keyring backend is the null backend, which keeps nothing",
    "keyrings.alt.file.PlaintextKeyring": (
        "the keyring backend {name} keeps secrets unencrypted in a file ({file})"
    ),
    "keyrings.alt.pyfs.PlaintextKeyring": (
        "the keyring backend {name} keeps secrets unencrypted in a file ({file})"
    ),
    "keyrings.alt.file_base.FileBacked": (
        "the keyring backend {name} keeps secrets in a file ({file}) whose protection is a "
        "password typed at a prompt, which a broker cannot answer"
    ),
}
"""Backends refused whatever priority they claim, by class path (matched on the class and
its bases, most derived first), with why. `{name}` and `{file}` are filled in."""

PLAINTEXT_BACKENDS = ("keyrings.alt.file.PlaintextKeyring", "keyrings.alt.pyfs.PlaintextKeyring")
"""Backends whose entries are readable as they are: a key found there is never used."""

ACCEPTED_TEXT = (
    "accepted: Windows Credential Manager, macOS Keychain, Secret Service (GNOME Keyring, "
    "KeePassXC, KWallet) or KWallet, or another backend of priority 1 or more that is not a "
    "plaintext or file backend"
)


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _mro_match(backend: object, table: Mapping[str, str] | Iterable[str]) -> str | None:
    """The first class path of `backend`'s class and bases (most derived first) in `table`."""
    for cls in type(backend).__mro__:
        if _class_path(cls) in table:
            return _class_path(cls)
    return None


def backend_name(backend: object) -> str:
    """A person's name for a keyring backend: ours for the OS facilities and the refused ones,
    else the backend's own `name` (keyring derives one from module and class when a backend
    does not set it)."""
    known = _mro_match(backend, OS_BACKENDS)
    if known is not None:
        if OS_BACKENDS[known] == "Secret Service":
            provider = secret_service_provider()
            return f"Secret Service ({provider})" if provider else "Secret Service"
        return OS_BACKENDS[known]
    if _mro_match(backend, REFUSED_BACKENDS) is not None and _class_path(type(backend)).startswith(
        "keyrings.alt."
    ):
        return f"keyrings.alt {type(backend).__name__}"
    name = getattr(backend, "name", None)
    return name if isinstance(name, str) and name else _class_path(type(backend))


SECRET_SERVICE_PROVIDERS = {
    "gnome-keyring-d": "GNOME Keyring",  # gnome-keyring-daemon, as the kernel shortens it
    "kwalletd5": "KWallet",
    "kwalletd6": "KWallet",
    "ksecretd": "KWallet",
    "keepassxc": "KeePassXC",
}


def secret_service_provider() -> str | None:
    """The program serving the Secret Service (org.freedesktop.secrets) on this session's
    D-Bus, by the name of its process (Linux), e.g. "GNOME Keyring"; None when unknown."""
    try:
        from jeepney.bus_messages import message_bus
        from jeepney.io.blocking import open_dbus_connection

        with open_dbus_connection(bus="SESSION") as conn:
            reply = conn.send_and_get_reply(
                message_bus.GetConnectionUnixProcessID("org.freedesktop.secrets"), timeout=2
            )
        comm = Path(f"/proc/{int(reply.body[0])}/comm").read_text().strip()
    except Exception:  # no jeepney, no session bus, no owner, not Linux: just "Secret Service"
        return None
    return SECRET_SERVICE_PROVIDERS.get(comm, comm or None)


@dataclass(frozen=True, slots=True)
class KeyringChoice:
    """The keyring backend a key store would use, and whether rbroker accepts it.

    `backend` is the backend itself (a chainer is resolved to the member it would write to:
    reads never fall through to a member rbroker refuses); `name` is for people; `refusal`
    is None when accepted, else why not (one clause, no fix).
    """

    backend: Any
    name: str
    refusal: str | None


def judge(backend: object) -> KeyringChoice:
    """Accept `backend` when it keeps secrets in an OS facility or encrypted: priority at
    least `MIN_PRIORITY` and not one of `REFUSED_BACKENDS`. A chainer is judged by its
    members: the first accepted one (in the chainer's own priority order) is used.

    A priority that cannot be read counts as refused, with keyring's reason.
    """
    name = backend_name(backend)
    if _mro_match(backend, ("keyring.backends.chainer.ChainerBackend",)) is not None:
        members = list(getattr(backend, "backends", []))
        judged = [judge(m) for m in members]
        for choice in judged:
            if choice.refusal is None:
                return choice
        if judged:
            return judged[0]
        return KeyringChoice(backend, name, REFUSED_BACKENDS["keyring.backends.fail.Keyring"])
    refused = _mro_match(backend, REFUSED_BACKENDS)
    if refused is not None:
        file = getattr(backend, "file_path", None) or "a file in the home directory"
        return KeyringChoice(backend, name, REFUSED_BACKENDS[refused].format(name=name, file=file))
    try:
        priority = float(type(backend).priority)  # type: ignore[attr-defined]
    except Exception as exc:  # keyring's "not viable here" is a RuntimeError, or anything
        return KeyringChoice(backend, name, f"the keyring backend {name} is not usable: {exc}")
    if priority < MIN_PRIORITY:
        return KeyringChoice(
            backend,
            name,
            f"the keyring backend {name} has priority {priority:g}, below {MIN_PRIORITY:g} "
            "(keyring's mark of a fallback backend that is not an OS keyring)",
        )
    return KeyringChoice(backend, name, None)


def choose_keyring() -> KeyringChoice:
    """The backend keyring picks for this process (environment, keyringrc, else the
    highest priority), judged by `judge`; finding and naming it are bounded in time.

    Raises:
        KeyStoreError: keyring did not answer within `KEYRING_TIMEOUT_S`.
    """
    import keyring

    return _bounded(lambda: judge(keyring.get_keyring()), "finding a backend")


def _plaintext_stores(choice: KeyringChoice | None) -> list[Any]:
    """Plaintext backends worth looking in for a key put there before rbroker refused them:
    the chosen backend when it is one, and keyrings.alt's PlaintextKeyring when installed.
    Reading them never prompts and never writes."""
    found: list[Any] = []
    if choice is not None and _mro_match(choice.backend, PLAINTEXT_BACKENDS) is not None:
        found.append(choice.backend)
    try:
        from keyrings.alt.file import PlaintextKeyring
    except ImportError:
        return found
    default = PlaintextKeyring()
    if all(getattr(b, "file_path", None) != default.file_path for b in found):
        found.append(default)
    return found


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
        got = _bounded(
            lambda: backend.get_password(KEYRING_SERVICE, self.account),
            f"read, OS account {self.os_account}",
        )
        return None if got is None else str(got)

    def plaintext_copies(self) -> list[str]:
        """Where an unencrypted copy of this entry sits (file paths); read-only."""
        found = []
        for backend in _plaintext_stores(self.choice):
            with contextlib.suppress(Exception):  # an unreadable file holds nothing for us
                if backend.get_password(KEYRING_SERVICE, self.account) is not None:
                    found.append(str(getattr(backend, "file_path", backend_name(backend))))
        return found

    def forget_plaintext_copies(self) -> list[str]:
        """Delete this entry from plaintext backends (after a new identity replaced it);
        returns the files it was removed from."""
        removed = []
        for backend in _plaintext_stores(self.choice):
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
        _bounded(
            lambda: backend.set_password(KEYRING_SERVICE, self.account, _encode(key)),
            f"write, OS account {self.os_account}",
        )

    def delete(self) -> None:
        import keyring.errors

        backend = self._backend()
        with contextlib.suppress(keyring.errors.PasswordDeleteError):
            _bounded(
                lambda: backend.delete_password(KEYRING_SERVICE, self.account),
                f"delete, OS account {self.os_account}",
            )


def _owner_hint(path: Path) -> str:
    """`; it belongs to OWNER: ...` for a key file the broker's account may not read."""
    try:
        import pwd

        owner = pwd.getpwuid(path.stat().st_uid).pw_name
    except (ImportError, KeyError, OSError):
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
        try:
            text = self.path.read_text(encoding="ascii")
        except FileNotFoundError:
            return None
        except PermissionError as exc:
            raise KeyStoreError(
                f"cannot read {self.path} as OS account {os_account()}: {exc.strerror}"
                f"{_owner_hint(self.path)}"
            ) from None
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

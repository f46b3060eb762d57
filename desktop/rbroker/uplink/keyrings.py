"""Which OS keyrings may hold a computer's private key, and calls into them that cannot hang.

Accepted: a backend that keeps secrets in an OS facility or encrypted (Windows Credential
Manager, macOS Keychain, Secret Service, KWallet), priority 1 or more. Refused whatever they
claim: keyring's own fallbacks (keyrings.alt's plaintext and file backends, the null and fail
backends). A chainer is judged by its members. `rbroker.uplink.keys` stores keys with it.
"""

from __future__ import annotations

import getpass
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

KEYRING_TIMEOUT_S = 5.0
"""How long a keyring call (read, write, delete a key) may take before it is given up: a
locked or hung OS keyring answers never, and the command says so and names --key-file."""

KEYRING_FIND_TIMEOUT_S = 20.0
"""How long finding the backend may take: keyring imports every installed backend and asks
each for its priority (the Secret Service one asks D-Bus), work that took more than 5 s on a
busy machine (seen under Wine, where imports are slow), so it gets a longer bound than a call
to the keyring itself."""
T = TypeVar("T")


class KeyStoreError(RuntimeError):
    """The key cannot be stored or read; the message names the store and the fix."""


_stuck: tuple[threading.Thread, float, float] | None = None
"""The latest keyring call, when it started (monotonic s) and its bound (s): while one is
past its bound and still running, new calls fail at once instead of piling up threads that
never return."""
_stuck_lock = threading.Lock()


def bounded(fn: Callable[[], T], what: str, timeout_s: float | None = None) -> T:
    """`fn()` on a daemon thread, given up after `timeout_s` (`KEYRING_TIMEOUT_S` unless
    given).

    A daemon thread, not a pool: a call that never returns must not keep the process
    from exiting (a pool's worker is joined at interpreter exit).
    """
    global _stuck
    if timeout_s is None:
        timeout_s = KEYRING_TIMEOUT_S
    outcome: list[tuple[bool, object]] = []

    def call() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the caller below
            outcome.append((False, exc))

    thread = threading.Thread(target=call, name="keyring", daemon=True)
    with _stuck_lock:
        if _stuck is not None and _stuck[0].is_alive() and time.monotonic() - _stuck[1] > _stuck[2]:
            raise KeyStoreError(
                f"the OS keyring did not answer within {_stuck[2]:g} s and has not "
                f"answered since ({what} not tried); unlock it or use --key-file"
            )
        _stuck = (thread, time.monotonic(), timeout_s)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        raise KeyStoreError(
            f"the OS keyring did not answer within {timeout_s:g} s ({what}); unlock it "
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
    if sys.platform == "win32":
        try:
            return getpass.getuser()
        except (OSError, KeyError):
            return "unknown"
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        try:
            return getpass.getuser()
        except (OSError, KeyError):  # no name for this uid (a container's arbitrary uid)
            return f"uid {os.geteuid()}"


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
        KeyStoreError: keyring did not answer within `KEYRING_FIND_TIMEOUT_S`.
    """
    import keyring

    return bounded(
        lambda: judge(keyring.get_keyring()), "finding a backend", KEYRING_FIND_TIMEOUT_S
    )


def plaintext_stores(choice: KeyringChoice | None) -> list[Any]:
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

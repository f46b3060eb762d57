"""Which keyring backends may hold a computer's private key (docs/architecture.md §7).

Accepted: an OS facility or an encrypted store, priority 1 or more. Refused, whatever they
claim: keyrings.alt's plaintext and file backends, the null and fail backends, and a chainer
that holds nothing better. The end-to-end behaviour (a real `rbroker enroll` against a real
coordinator) is in tests/e2e/test_enroll_keyring_policy.py.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keyring.backends.fail
import keyring.backends.null
import pytest
from keyring.backend import KeyringBackend
from keyring.backends.chainer import ChainerBackend
from keyring.compat.properties import classproperty
from keyrings.alt.file import EncryptedKeyring, PlaintextKeyring

from rbroker.uplink.keyrings import backend_name, judge

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

_ACTIVE = False
"""The doubles below are viable only inside a test: keyring registers every backend class
it sees, and one of priority 10 must never become this process's default keyring."""


def _viable(priority: float) -> float:
    if not _ACTIVE:
        raise RuntimeError("a test double, outside its test")
    return priority


class _Store(KeyringBackend):
    def get_password(self, service: str, username: str) -> str | None:
        return None

    def set_password(self, service: str, username: str, password: str) -> None:
        raise AssertionError("judging never writes")


class OsLikeKeyring(_Store):
    name = "an encrypted test store"  # type: ignore[assignment]

    @classproperty
    def priority(cls) -> float:
        return _viable(5)


class FallbackKeyring(_Store):
    @classproperty
    def priority(cls) -> float:
        return _viable(0.5)


class LoudPlaintext(PlaintextKeyring):
    """A plaintext backend that claims a high priority: refused for what it is."""

    @classproperty
    def priority(cls) -> float:
        return _viable(5)


class _FixedChainer(ChainerBackend):
    """A chainer over given members (keyring's own computes them from the registry)."""

    def __init__(self, members: tuple[Any, ...]) -> None:
        super().__init__()
        self.members = list(members)

    @classproperty
    def priority(cls) -> float:
        return _viable(10)

    @property
    def backends(self) -> list[Any]:  # type: ignore[override]
        return self.members


@pytest.fixture(autouse=True)
def doubles_viable() -> Iterator[None]:
    global _ACTIVE
    _ACTIVE = True
    try:
        yield
    finally:
        _ACTIVE = False


def test_os_facility_or_encrypted_store_is_accepted() -> None:
    choice = judge(OsLikeKeyring())
    assert choice.refusal is None
    assert choice.name == "an encrypted test store"


@pytest.mark.parametrize(
    ("backend", "why"),
    [
        (keyring.backends.fail.Keyring(), "no OS keyring backend is available"),
        (keyring.backends.null.Keyring(), "null backend"),
        (PlaintextKeyring(), "keeps secrets unencrypted in a file"),
        (LoudPlaintext(), "keeps secrets unencrypted in a file"),
        (EncryptedKeyring.__new__(EncryptedKeyring), "a password typed at a prompt"),
        (FallbackKeyring(), "priority 0.5, below 1"),
    ],
    ids=["fail", "null", "plaintext", "plaintext-priority-5", "file-encrypted", "priority-0.5"],
)
def test_fallback_backends_are_refused(backend: KeyringBackend, why: str) -> None:
    choice = judge(backend)
    assert choice.refusal is not None and why in choice.refusal, choice.refusal


def test_plaintext_refusal_names_the_file() -> None:
    backend = PlaintextKeyring()
    choice = judge(backend)
    assert choice.name == "keyrings.alt PlaintextKeyring"
    assert choice.refusal is not None and str(backend.file_path) in choice.refusal


def test_a_chainer_is_judged_by_the_member_it_would_use() -> None:
    good = OsLikeKeyring()
    mixed = judge(_FixedChainer((PlaintextKeyring(), good)))
    assert mixed.refusal is None and mixed.backend is good  # reads never reach the file
    only_fallbacks = judge(_FixedChainer((PlaintextKeyring(), FallbackKeyring())))
    assert only_fallbacks.refusal is not None
    assert "unencrypted" in only_fallbacks.refusal
    empty = judge(_FixedChainer(()))
    assert empty.refusal is not None and "no OS keyring" in empty.refusal


def test_os_backends_have_people_names() -> None:
    from keyring.backends import SecretService, Windows, macOS

    assert backend_name(Windows.WinVaultKeyring.__new__(Windows.WinVaultKeyring)) == (
        "Windows Credential Manager"
    )
    assert backend_name(macOS.Keyring.__new__(macOS.Keyring)) == "macOS Keychain"
    assert backend_name(SecretService.Keyring.__new__(SecretService.Keyring)) == "Secret Service"


def _fleet_error_as_reader(data_dir: str) -> str:
    """In the other user's process: what `fetch_fleet` says (no network is reached)."""
    from rbroker.uplink.fleet import FleetError, fetch_fleet

    try:
        fetch_fleet(Path(data_dir))
    except FleetError as exc:
        return str(exc)
    return "no error"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")
def test_a_user_reading_the_fleet_is_never_told_to_take_the_system_brokers_key(
    other_user: Any,
) -> None:
    """On a shared server the key belongs to the system broker's account: a user's `rbroker
    fleet --data-dir` once said "chown the file (and the data dir) to <user>", which would
    stop the broker reporting. Now: a viewer token, or read the fleet as that account."""
    import pwd

    from rbroker.uplink.config import UplinkConfig
    from tests.conftest import short_tmp
    from tests.os_users import run_as

    root = short_tmp()
    data = root / "system-data"
    UplinkConfig(
        "https://coordinator.example:8787", "c-1", "lab", "gpu-1", key_backend="file"
    ).save(data)
    key = data / "computer.key"
    key.write_text("not read\n")
    key.chmod(0o600)
    for path in (root, data, data / "uplink.json"):
        path.chmod(path.stat().st_mode | 0o005)
    owner = pwd.getpwuid(os.geteuid()).pw_name
    text = run_as(other_user, _fleet_error_as_reader, str(data))
    assert text.startswith(
        f"this computer's key in {data} belongs to {owner}, the account its broker runs as, "
        f"and {other_user.name} may not read it"
    ), text
    assert "viewer token" in text and f"sudo -u {owner} rbroker fleet --data-dir {data}" in text
    assert "chown" not in text
    shutil.rmtree(root, ignore_errors=True)

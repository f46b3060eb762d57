"""Which keyring backends may hold a computer's private key (docs/architecture.md §7).

Accepted: an OS facility or an encrypted store, priority 1 or more. Refused, whatever they
claim: keyrings.alt's plaintext and file backends, the null and fail backends, and a chainer
that holds nothing better. The end-to-end behaviour (a real `rbroker enroll` against a real
coordinator) is in tests/e2e/test_enroll_keyring_policy.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import keyring.backends.fail
import keyring.backends.null
import pytest
from keyring.backend import KeyringBackend
from keyring.backends.chainer import ChainerBackend
from keyring.compat.properties import classproperty
from keyrings.alt.file import EncryptedKeyring, PlaintextKeyring

from rbroker.uplink.keyrings import backend_name, judge

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

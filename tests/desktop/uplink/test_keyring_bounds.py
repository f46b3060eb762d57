"""Keyring calls are bounded in time, and finding the backend has a bound of its own: keyring
imports and ranks every installed backend, which took more than a key read's 5 s on a busy
machine (`rbroker enroll` under Wine: "the OS keyring did not answer within 5 s (finding a
backend)") although nothing hung."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import keyring
import keyring.backends.fail
import pytest

from rbroker.uplink import keyrings
from rbroker.uplink.keyrings import KeyStoreError, bounded, choose_keyring


@pytest.fixture
def short_bounds(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A key call's bound 0.1 s, finding a backend's 2 s; no stuck call left for the next
    test (a call past its bound that still runs refuses every later one in the process)."""
    monkeypatch.setattr(keyrings, "KEYRING_TIMEOUT_S", 0.1)
    monkeypatch.setattr(keyrings, "KEYRING_FIND_TIMEOUT_S", 2.0)
    yield
    stuck = keyrings._stuck
    if stuck is not None:
        stuck[0].join(5)
    monkeypatch.setattr(keyrings, "_stuck", None)


def test_finding_a_backend_slower_than_a_key_call_still_finds_it(
    short_bounds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = keyring.backends.fail.Keyring()

    def slow_get_keyring() -> keyring.backends.fail.Keyring:
        time.sleep(0.4)  # longer than a key call's bound, well within finding's
        return found

    monkeypatch.setattr(keyring, "get_keyring", slow_get_keyring)
    choice = choose_keyring()  # found and judged (this one is refused by name), not timed out
    assert choice.backend is found


def test_a_key_call_keeps_its_own_bound(short_bounds: None) -> None:
    done = threading.Event()
    with pytest.raises(KeyStoreError) as err:
        bounded(lambda: done.wait(0.4), "reading the key")
    assert str(err.value) == (
        "the OS keyring did not answer within 0.1 s (reading the key); unlock it or use --key-file"
    )


def test_finding_a_backend_that_never_answers_is_given_up_after_its_bound(
    monkeypatch: pytest.MonkeyPatch, short_bounds: None
) -> None:
    monkeypatch.setattr(keyrings, "KEYRING_FIND_TIMEOUT_S", 0.3)
    release = threading.Event()
    monkeypatch.setattr(keyring, "get_keyring", lambda: release.wait(3))
    started = time.monotonic()
    try:
        with pytest.raises(KeyStoreError, match=r"within 0\.3 s \(finding a backend\)"):
            choose_keyring()
        assert time.monotonic() - started < 2.0
        # while it still runs past its bound, the next call is refused at once, naming it
        with pytest.raises(KeyStoreError, match=r"within 0\.3 s and has not answered since"):
            bounded(lambda: None, "reading the key")
    finally:
        release.set()

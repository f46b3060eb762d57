"""Enrollment with the private key in Windows Credential Manager (keyring's WinVaultKeyring):
`rbroker enroll` without `--key-file` stores it there (a generic credential, not a file),
the broker reads it back and signs reports the coordinator accepts, and without the entry
the broker's link names the store, the OS account and the fix.

Runs under the Windows interpreter (real Windows or Wine, whose advapi32 keeps credentials
in the registry).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rbroker.demo.coordinator import LocalCoordinator, run_module
from tests.conftest import wait_until
from tests.windows.cli import wait_until_reported

pytestmark = pytest.mark.skipif(
    sys.platform != "win32", reason="Windows only: Windows Credential Manager"
)

ENV = {**os.environ, "COLUMNS": "1000", "PYTHONIOENCODING": "utf-8"}


@pytest.fixture
def enrolled(coordinator: LocalCoordinator, tmp_path: Path) -> Iterator[tuple[str, Path, str]]:
    """`rbroker enroll URL CODE` with no --key-file → (name, data dir, its output); the
    Credential Manager entry is removed at teardown."""
    name = f"win-{uuid.uuid4().hex[:6]}"
    data_dir = tmp_path / "broker"
    done = run_module(
        "rbroker", "enroll", coordinator.url, coordinator.new_code(), "--name", name,
        "--data-dir", str(data_dir), env=ENV, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    yield name, data_dir, done.stderr
    forget(data_dir)


def credential(data_dir: Path) -> dict[str, Any] | None:
    """The generic credential holding `data_dir`'s key, read with CredEnumerate (pywin32)."""
    import pywintypes
    import win32cred

    from rbroker.uplink.keys import KEYRING_SERVICE, KeyringKeyStore

    account = KeyringKeyStore(data_dir).account
    try:
        creds = win32cred.CredEnumerate(None, 0)
    except pywintypes.error:  # ERROR_NOT_FOUND: no credentials at all
        return None
    for cred in creds:
        if cred["Type"] == win32cred.CRED_TYPE_GENERIC and cred["UserName"] == account:
            assert KEYRING_SERVICE in cred["TargetName"], cred["TargetName"]
            return dict(cred)
    return None


def forget(data_dir: Path) -> None:
    """Remove `data_dir`'s credential with CredDelete (pywin32), not through keyring in this
    process: after a long run under Wine, keyring's first call here (its backend discovery)
    once took longer than rbroker's 5 s bound, and every later call in this process then
    failed at once ("has not answered since"). The broker and the CLI, each a process of its
    own, are what the tests judge."""
    import pywintypes
    import win32cred

    cred = credential(data_dir)
    if cred is not None:
        with contextlib.suppress(pywintypes.error):
            win32cred.CredDelete(cred["TargetName"], win32cred.CRED_TYPE_GENERIC, 0)


def start_broker(data_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    pipe = rf"\\.\pipe\rbroker-krtest-{uuid.uuid4().hex[:8]}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rbroker", "broker", "--simulate", "--socket", pipe,
             "--machine-lock", "per-socket", "--data-dir", str(data_dir)],
            stdout=out, stderr=subprocess.STDOUT, env=ENV,
        )  # fmt: skip
    return proc, pipe


def test_enroll_keeps_the_key_in_credential_manager(enrolled: tuple[str, Path, str]) -> None:
    name, data_dir, said = enrolled
    assert "private key kept in Windows Credential Manager" in said, said
    assert not (data_dir / "computer.key").exists()
    uplink = json.loads((data_dir / "uplink.json").read_text())
    assert uplink["key_backend"] == "keyring"
    assert uplink["name"] == name
    cred = credential(data_dir)
    assert cred is not None, "no generic credential for the key"
    blob = cred["CredentialBlob"]
    text = blob.decode("utf-16-le") if isinstance(blob, bytes) else str(blob)
    assert len(base64.b64decode(text)) == 32  # the Ed25519 seed


def test_broker_signs_reports_with_the_key_from_credential_manager(
    coordinator: LocalCoordinator, enrolled: tuple[str, Path, str], tmp_path: Path
) -> None:
    name, data_dir, _ = enrolled
    broker, _pipe = start_broker(data_dir, tmp_path / "broker.log")
    try:
        computer = wait_until_reported(coordinator, name, broker, tmp_path / "broker.log")
        assert computer["freshness"]["state"] == "online"
    finally:
        broker.kill()
        broker.wait(30)


def test_broker_without_the_entry_names_store_account_and_fix(
    enrolled: tuple[str, Path, str], tmp_path: Path
) -> None:
    from rbroker.uplink.keys import KeyringKeyStore

    _, data_dir, _ = enrolled
    # the entry, and any entry of this account left by an earlier run of the shared prefix
    # (keyring moves it to ACCOUNT@rbroker when a new one is stored): the broker must find none
    while (left := credential(data_dir)) is not None:
        import win32cred

        win32cred.CredDelete(left["TargetName"], left["Type"], 0)
    assert credential(data_dir) is None
    broker, pipe = start_broker(data_dir, tmp_path / "broker.log")
    try:

        def link() -> str | None:
            done = run_module("rbroker", "status", "--socket", pipe, "--json", env=ENV)
            if done.returncode != 0:  # not listening yet
                assert broker.poll() is None, (tmp_path / "broker.log").read_text()
                return None
            text = str(json.loads(done.stdout)["status"]["coordinator"]["link"])
            return text if text.startswith("key unavailable") else None

        text = str(wait_until(link, timeout_s=90, interval_s=1))
        assert "the private key is not in Windows Credential Manager of OS account" in text
        assert KeyringKeyStore(data_dir).account in text
        assert "--key-file" in text
    finally:
        broker.kill()
        broker.wait(30)

"""`rbroker enroll` reads the coordinator's answer as the declared shape
(`rbroker_protocol.enroll.EnrollResponse`) and sends the declared request: an answer that is
not that shape (a proxy's page, another service on the port) is one line naming the problem,
and the key made for the enrollment is taken back. A real HTTP server on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from rbroker.uplink.config import UplinkConfig
from rbroker.uplink.enroll import EnrollError, enroll
from tests.fakes.coordinator import Answer, FakeCoordinator


@pytest.fixture
def coordinator() -> Iterator[FakeCoordinator]:
    with FakeCoordinator(then=Answer(201, b"")) as fake:
        yield fake


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"<html>a proxy's page</html>", "is not what rbroker expects"),
        (b"{}", "is not what rbroker expects"),
        (b'{"computer_id": 7, "group": "vision"}', "is not what rbroker expects"),
    ],
)
def test_an_answer_of_another_shape_is_one_line_and_the_key_goes(
    coordinator: FakeCoordinator, tmp_path: Path, answer: bytes, said: str
) -> None:
    coordinator.then = Answer(201, answer)
    with pytest.raises(EnrollError) as caught:
        enroll(coordinator.url, "CODE-1", "lab-1", tmp_path, key_file=True)
    text = str(caught.value)
    assert said in text and "\n" not in text, text
    assert not (tmp_path / "computer.key").exists()
    assert not (tmp_path / "uplink.json").exists()
    (sent,) = [json.loads(body) for body in coordinator.bodies]
    assert set(sent) == {"code", "name", "public_key"}
    assert sent["code"] == "CODE-1" and sent["name"] == "lab-1"


def test_the_declared_answer_enrolls(coordinator: FakeCoordinator, tmp_path: Path) -> None:
    coordinator.then = Answer(201, b'{"computer_id": "c_0123456789abcdef", "group": "vision"}')
    config = enroll(coordinator.url, "CODE-1", "lab-1", tmp_path, key_file=True)
    assert (config.computer_id, config.group) == ("c_0123456789abcdef", "vision")
    assert (tmp_path / "computer.key").exists()


def test_a_new_identity_keeps_the_settings_enrolling_does_not_ask_for(
    coordinator: FakeCoordinator, tmp_path: Path
) -> None:
    """Before: `--new-identity` wrote a fresh `uplink.json`, so a `report_interval_s` set in
    the old one fell back to 5 s. Right: what the enrollment gives (URL, name, key store, CA
    file) is new, the rest is kept."""
    coordinator.then = Answer(201, b'{"computer_id": "c_0123456789abcdef", "group": "vision"}')
    first = enroll(coordinator.url, "CODE-1", "lab-1", tmp_path, key_file=True)
    tuned = dataclasses.replace(first, report_interval_s=2.5, extra={"telemetry_v2": True})
    tuned.save(tmp_path)
    coordinator.then = Answer(201, b'{"computer_id": "c_fedcba9876543210", "group": "nlp"}')
    again = enroll(coordinator.url, "CODE-2", "lab-1b", tmp_path, key_file=True, new_identity=True)
    assert (again.computer_id, again.group, again.name) == ("c_fedcba9876543210", "nlp", "lab-1b")
    assert again.report_interval_s == 2.5
    assert again.extra == {"telemetry_v2": True}
    assert UplinkConfig.load(tmp_path) == again


@pytest.mark.parametrize("detail", ["enrollment code [/x] is unknown", "see [red]the docs[/]"])
def test_a_refusal_with_brackets_is_printed_as_written(
    coordinator: FakeCoordinator,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    detail: str,
) -> None:
    """Before: `rbroker enroll` printed the coordinator's refusal as rich markup, so `[/x]`
    raised MarkupError (a traceback) and `[red]…[/]` lost its brackets. Right: one line with
    the text as the coordinator wrote it, exit 1."""
    from rbroker.cli.main import main

    coordinator.then = Answer(400, json.dumps({"detail": detail}).encode())
    code = main(["enroll", coordinator.url, "CODE-1", "--data-dir", str(tmp_path), "--key-file"])
    out = capsys.readouterr()
    assert code == 1
    said = (out.out + out.err).strip()
    assert detail in said and "Traceback" not in said, said
    assert said.startswith("rbroker enroll:"), said


class _MemoryKeyring:
    """An OS keyring stand-in for one data dir (the keyring's own choice is tested in
    test_key_storage_policy.py and, with a real Secret Service, in tests/e2e)."""

    keys: ClassVar[dict[str, object]] = {}

    def __init__(self, data_dir: Path) -> None:
        self.name = str(data_dir)

    def load(self) -> object:
        return self.keys.get(self.name)

    def save(self, key: object) -> None:
        self.keys[self.name] = key

    def delete(self) -> None:
        self.keys.pop(self.name, None)

    def where(self) -> str:
        return "the OS keyring"

    def forget_plaintext_copies(self) -> list[str]:
        return []


def test_a_new_identity_in_the_keyring_removes_the_old_key_file(
    coordinator: FakeCoordinator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: enrolling again with the key in the keyring left the old identity's
    `computer.key` (an unencrypted private key of a revoked computer) in the data dir."""
    from rbroker.uplink import enroll as enroll_module

    monkeypatch.setattr(enroll_module, "KeyringKeyStore", _MemoryKeyring)
    coordinator.then = Answer(201, b'{"computer_id": "c_0123456789abcdef", "group": "vision"}')
    enroll(coordinator.url, "CODE-1", "lab-1", tmp_path, key_file=True)
    assert (tmp_path / "computer.key").exists()
    notes: list[str] = []
    coordinator.then = Answer(201, b'{"computer_id": "c_fedcba9876543210", "group": "vision"}')
    again = enroll(coordinator.url, "CODE-2", "lab-1", tmp_path, new_identity=True, notes=notes)
    assert again.key_backend == "keyring"
    assert _MemoryKeyring.keys.get(str(tmp_path)) is not None
    assert not (tmp_path / "computer.key").exists()
    assert any("removed the old identity's key from the key file" in n for n in notes), notes

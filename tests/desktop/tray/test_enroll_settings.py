"""The Settings tab enrolls like `rbroker enroll`, against a real HTTPS coordinator with its
own CA (a real Qt event loop, offscreen; the enrollment runs on the tray's worker thread).

Without the CA file the certificate is refused, and the message names the Settings control,
not a flag; the CA file comes from the file picker; with no usable OS keyring the key-file
option is offered and the key lands in a file (mode 0600 on POSIX); the enrolled URL and
group are shown; "Enroll again" asks first, and only a confirmed one makes a new identity.
"""

from __future__ import annotations

import importlib.util
import json
import re
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import keyring
import keyring.backends.fail
import pytest
from pytestqt.qtbot import QtBot

from rbroker.tray.app import TrayApp
from rbroker.tray.wording import gui_text

if importlib.util.find_spec("litestar") is None:  # pragma: no cover - server extra missing
    pytest.skip("needs rbroker[server] for the coordinator", allow_module_level=True)

from tests.e2e.conftest import (  # after the skip: it needs the server extra
    CoordinatorProcess,
    coordinator_factory,  # noqa: F401 - fixture used by name
)
from tests.e2e.keyring_backends import EncryptedFileKeyring

pytestmark = pytest.mark.slow
TIMEOUT_MS = 30_000
FLAG = re.compile(r"(?<![\w-])--[a-z]")


@pytest.fixture
def keyring_backend() -> Iterator[Callable[[keyring.backend.KeyringBackend], None]]:
    """Set this process's keyring backend for the test; the previous one comes back."""
    before = keyring.get_keyring()
    yield keyring.set_keyring
    keyring.set_keyring(before)


@pytest.fixture
def tray(make_tray: Callable[..., TrayApp], tmp_path: Path) -> Callable[[], TrayApp]:
    return lambda: make_tray(str(tmp_path / "none.sock"), data_dir=tmp_path / "data")


def _enroll(qtbot: QtBot, app: TrayApp, button: object) -> str:
    tab = app.window.settings_tab
    button.click()  # type: ignore[attr-defined]
    qtbot.waitUntil(
        lambda: tab.enroll_state.text() and not tab.enroll_state.text().startswith("Enrolling"),
        timeout=TIMEOUT_MS,
    )
    return str(tab.enroll_state.text())


def test_settings_enroll_with_ca_file_key_file_and_enroll_again(
    qtbot: QtBot,
    tmp_path: Path,
    coordinator_factory: Callable[..., CoordinatorProcess],  # noqa: F811
    keyring_backend: Callable[[keyring.backend.KeyringBackend], None],
    tray: Callable[[], TrayApp],
) -> None:
    keyring_backend(keyring.backends.fail.Keyring())  # a headless machine: no OS keyring
    c = coordinator_factory(tls=True)
    assert c.ca_file is not None and c.url.startswith("https://")
    app = tray()
    tab = app.window.settings_tab
    data = tmp_path / "data"
    assert tab.enrollment.text() == "Not enrolled."
    assert not tab.enroll_button.isHidden() and tab.reenroll_button.isHidden()
    assert not tab.key_file.isHidden() and tab.key_file.isChecked()  # offered: no keyring
    assert "no usable OS keyring" in tab.key_file_note.text()

    # no CA file: the self-signed certificate is refused; the hint names Settings' CA file
    tab.url.setText(c.url)
    tab.code.setText(c.first_code)
    text = _enroll(qtbot, app, tab.enroll_button)
    assert text.startswith("Not enrolled: cannot reach the coordinator"), text
    assert "choose its CA file (tls/ca.pem) in Settings" in text, text
    assert not FLAG.search(text), text
    assert not (data / "uplink.json").exists()

    # the file picker fills the CA file; then the enrollment goes through
    offered: list[str] = []
    tab.pick_file = lambda parent, start: offered.append(start) or c.ca_file or ""
    tab.ca_button.click()
    assert tab.ca_file.text() == c.ca_file and offered
    text = _enroll(qtbot, app, tab.enroll_button)
    assert text.startswith("Enrolled "), text
    config = json.loads((data / "uplink.json").read_text())
    assert config["key_backend"] == "file" and config["ca_file"] == str(Path(c.ca_file).resolve())
    if sys.platform != "win32":  # Windows has no mode bits: the profile's access list
        assert stat.S_IMODE((data / "computer.key").stat().st_mode) == 0o600
    first_id = config["computer_id"]
    shown = tab.enrollment.text()
    assert f"Enrolled at {c.url} in group {c.group}" in shown and first_id in shown, shown
    assert "a file in the data directory" in shown
    assert tab.enroll_button.isHidden() and not tab.reenroll_button.isHidden()
    assert tab.code.text() == ""
    assert [x["name"] for x in c.fleet()["computers"]] != []

    # enroll again: asks first; "No" changes nothing
    asked: list[str] = []
    tab.code.setText(c.new_code())
    tab.confirm = lambda parent, title, question: asked.append(question) and False
    tab.reenroll_button.click()
    assert asked and "new identity" in asked[0] and "new computer" in asked[0]
    assert tab.enroll_state.text() == "Not enrolled again: cancelled."
    assert json.loads((data / "uplink.json").read_text())["computer_id"] == first_id

    # "Yes": a new key pair and a new computer at the coordinator
    tab.confirm = lambda parent, title, question: True
    text = _enroll(qtbot, app, tab.reenroll_button)
    assert text.startswith("Enrolled "), text
    second_id = json.loads((data / "uplink.json").read_text())["computer_id"]
    assert second_id != first_id and second_id in tab.enrollment.text()
    assert len(c.fleet()["computers"]) == 2

    # a bad code: the refusal in words, no flag
    tab.code.setText("rbe_nope_nope")
    tab.confirm = lambda parent, title, question: True
    text = _enroll(qtbot, app, tab.reenroll_button)
    assert text.startswith("Not enrolled: "), text
    assert not FLAG.search(text), text


def test_the_key_file_is_not_offered_where_a_keyring_works(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    keyring_backend: Callable[[keyring.backend.KeyringBackend], None],
    tray: Callable[[], TrayApp],
) -> None:
    monkeypatch.setenv("RBROKER_TEST_KEYRING_FILE", str(tmp_path / "keyring.json"))
    keyring_backend(EncryptedFileKeyring())
    tab = tray().window.settings_tab
    assert tab.key_file.isHidden() and tab.key_file_note.isHidden()


def test_gui_text_never_shows_a_flag() -> None:
    text = gui_text("pass --ca-file with its tls/ca.pem, or use --key-file; or --frobnicate")
    assert text == (
        'choose the "CA file" setting with its tls/ca.pem, or choose the "Keep the private key '
        'in a file" option; or'
    )
    assert gui_text("use --new-identity to enroll it again") == (
        'choose "Enroll again" to enroll it again'
    )


def test_a_click_right_after_an_answer_starts_the_next_enrollment(
    qtbot: QtBot,
    keyring_backend: Callable[[keyring.backend.KeyringBackend], None],
    tray: Callable[[], TrayApp],
) -> None:
    """The answer of an enrollment is shown while its worker thread may still be returning;
    a click then starts the next enrollment instead of being dropped (seen under load: the
    second attempt, with the CA file chosen, showed the first attempt's refusal again)."""
    import threading

    keyring_backend(keyring.backends.fail.Keyring())  # the key-file option: no keyring wait
    app = tray()
    tab = app.window.settings_tab
    tab.url.setText("http://127.0.0.1:9")  # nothing listens on the discard port
    tab.code.setText("ABCD-EFGH")
    first = _enroll(qtbot, app, tab.enroll_button)
    assert first.startswith("Not enrolled: nothing accepts connections"), first

    release = threading.Event()
    still_returning = threading.Thread(target=release.wait, daemon=True)
    still_returning.start()
    app._enroll_thread = still_returning  # the last worker, not yet returned
    try:
        tab.enroll_button.click()
        assert tab.enroll_state.text().startswith("Enrolling at http://127.0.0.1:9"), (
            tab.enroll_state.text()
        )
        again = _enroll_answer(qtbot, app)
        assert again.startswith("Not enrolled: nothing accepts connections"), again
    finally:
        release.set()
        still_returning.join(5)


def _enroll_answer(qtbot: QtBot, app: TrayApp) -> str:
    """The answer of the enrollment under way, once shown."""
    tab = app.window.settings_tab
    qtbot.waitUntil(lambda: not tab.enroll_state.text().startswith("Enrolling"), timeout=TIMEOUT_MS)
    return str(tab.enroll_state.text())

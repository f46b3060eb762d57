"""The tray app on Windows, offscreen, against a broker process over a named pipe: the
window shows a lease a real client holds, and the test writes a screenshot of it (a PNG
under the test's tmp_path, copied to `$RBROKER_SCREENSHOT_DIR` when that is set).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "win32", reason="Windows only: the tray on a named-pipe broker"
)

if sys.platform == "win32":  # before Qt starts (Wine does not pass QT_* from Linux)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    _DEJAVU = Path(r"Z:\usr\share\fonts\truetype\dejavu")
    if _DEJAVU.is_dir():  # Wine: the host's fonts, or every glyph is a box
        os.environ.setdefault("QT_QPA_FONTDIR", str(_DEJAVU))

import rbroker  # noqa: E402
from tests.windows.test_pipe_failures_windows import PipeBroker, new_pipe  # noqa: E402

TIMEOUT_MS = 20_000
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def pipe_broker(tmp_path: Path) -> Iterator[PipeBroker]:
    broker = PipeBroker(new_pipe(), tmp_path / "data")
    yield broker
    broker.stop()


def test_window_shows_a_lease_over_the_pipe_and_is_saved_as_png(
    qtbot: object, pipe_broker: PipeBroker, tmp_path: Path
) -> None:
    from rbroker.tray.app import TrayApp
    from rbroker.tray.settings import TraySettings

    app = TrayApp(pipe_broker.address, TraySettings(), show_window=True)
    qtbot.addWidget(app.window)  # type: ignore[attr-defined]
    app.start()
    try:
        with rbroker.lease(
            6144,
            project="vision",
            session="win-42",
            purpose="tray over a pipe",
            socket=pipe_broker.address,
        ) as lease:
            leases = app.window.local.leases

            def shows_lease() -> None:
                assert leases.rowCount() == 1
                row = [leases.data(leases.index(0, c)) for c in range(leases.columnCount())]
                assert row[1:5] == ["vision", "win-42", "tray over a pipe", "6 144"], row

            qtbot.waitUntil(shows_lease, timeout=TIMEOUT_MS)  # type: ignore[attr-defined]
            app.window.resize(1180, 900)
            app.window.tabs.setCurrentIndex(0)
            qtbot.wait(300)  # type: ignore[attr-defined]
            shot = tmp_path / "tray-windows-local.png"
            assert app.window.grab().save(str(shot))
            assert lease.lease_id
    finally:
        app.shutdown()
    data = shot.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000, len(data)
    from PySide6.QtGui import QImage

    image = QImage(str(shot))
    assert (image.width(), image.height()) == (1180, 900)
    out = os.environ.get("RBROKER_SCREENSHOT_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(out) / shot.name)

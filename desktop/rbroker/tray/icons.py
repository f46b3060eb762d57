"""Tray and window icons, drawn from the SVG files in `assets/` through QtSvg.

`python -m rbroker.tray.icons` renders `assets/rbroker.svg` to the PNG and ICO app icons
(the ICO is what the PyInstaller build embeds in the executable).
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QIcon, QImage, QPainter, QPixmap
from PySide6.QtSvg import QSvgRenderer

from rbroker.tray.state import TrayState

ICON_SIZES = (16, 20, 22, 24, 32, 40, 48, 64, 128)

FALLBACK_COLORS = {
    TrayState.IDLE: "#4f6b86",
    TrayState.ACTIVE: "#2f6fdb",
    TrayState.WAITING: "#d49a1a",
    TrayState.FULL: "#b3261e",
    TrayState.TELEMETRY: "#f2c12e",
    TrayState.COORDINATOR: "#d0453a",
    TrayState.BROKER_DOWN: "#c9ced6",
}


def assets_dir() -> Path | None:
    """Where the SVGs are: a PyInstaller bundle, a packaged copy next to this module, or
    the source checkout's `assets/`."""
    here = Path(__file__).resolve().parent
    candidates = []
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        candidates.append(Path(bundle) / "assets")
    candidates += [here / "assets", here.parents[2] / "assets"]
    for path in candidates:
        if (path / "tray-idle.svg").is_file():
            return path
    return None


def state_file(state: TrayState) -> str:
    """The SVG file name of a tray state."""
    return f"tray-{state.value}.svg"


def render_svg(path: Path, size: int) -> QPixmap:
    """A square pixmap of an SVG file (transparent background)."""
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    renderer = QSvgRenderer(str(path))
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter, QRectF(0, 0, size, size))
    painter.end()
    return QPixmap.fromImage(image)


def _fallback(state: TrayState, size: int) -> QPixmap:
    pix = QPixmap(size, size)
    pix.fill(Qt.GlobalColor.transparent)
    p = QPainter(pix)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    p.setBrush(QColor(FALLBACK_COLORS[state]))
    p.setPen(Qt.PenStyle.NoPen)
    p.drawRoundedRect(QRectF(1, 1, size - 2, size - 2), size / 6, size / 6)
    p.end()
    return pix


def _icon_from(path: Path | None, state: TrayState | None) -> QIcon:
    icon = QIcon()
    for size in ICON_SIZES:
        if path is not None and path.is_file():
            icon.addPixmap(render_svg(path, size))
        else:
            icon.addPixmap(_fallback(state or TrayState.ACTIVE, size))
    return icon


@cache
def state_icon(state: TrayState) -> QIcon:
    """The tray icon for `state` (needs a QGuiApplication)."""
    base = assets_dir()
    return _icon_from(base / state_file(state) if base else None, state)


@cache
def app_icon() -> QIcon:
    """The application (window) icon."""
    base = assets_dir()
    return _icon_from(base / "rbroker.svg" if base else None, None)


def write_app_icons(base: Path) -> list[Path]:
    """Render `base/rbroker.svg` to `rbroker.png` (256 px) and `rbroker.ico`."""
    svg = base / "rbroker.svg"
    png = base / "rbroker.png"
    ico = base / "rbroker.ico"
    render_svg(svg, 256).save(str(png), "PNG")
    image = (
        render_svg(svg, 256).toImage().scaled(QSize(256, 256), Qt.AspectRatioMode.KeepAspectRatio)
    )
    image.save(str(ico), b"ICO")
    return [png, ico]


def main() -> int:
    from PySide6.QtGui import QGuiApplication

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    base = assets_dir()
    if base is None:
        print("assets/ not found", file=sys.stderr)
        return 1
    for path in write_app_icons(base):
        print(path)
    del app
    return 0


if __name__ == "__main__":
    sys.exit(main())

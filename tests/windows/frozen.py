"""The frozen Windows app (`bash .ci/wine freeze`, packaging/windows/rbroker.spec) as the
Windows tests find it: `dist/windows/rbroker/` of this checkout, or `RBROKER_FROZEN_DIR`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FROZEN_DIR = Path(os.environ.get("RBROKER_FROZEN_DIR") or REPO / "dist" / "windows" / "rbroker")
NOT_BUILT = (
    f"the frozen app is not built ({FROZEN_DIR} has no rbroker.exe): bash .ci/wine freeze "
    "(on Windows: pyinstaller packaging/windows/rbroker.spec, then RBROKER_FROZEN_DIR)"
)


def frozen_exe(name: str) -> str:
    """The path of the frozen program `name` (`rbroker`, `rbroker-tray`, `rbroker-service`);
    skips the test, naming how to build it, when the app is not built."""
    exe = FROZEN_DIR / f"{name}.exe"
    if not exe.is_file():
        pytest.skip(NOT_BUILT)
    return str(exe)

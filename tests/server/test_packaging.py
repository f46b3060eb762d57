"""Deployment files: the systemd unit's hardening and the Windows launchers."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "packaging" / "linux" / "rbroker-server.service"


def _unit() -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser


def test_systemd_unit_is_hardened() -> None:
    service = _unit()["Service"]
    assert service["User"] == "rbroker-server"
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert service["PrivateTmp"] == "yes"
    assert service["ReadWritePaths"] == "/var/lib/rbroker-server"
    assert "--data-dir /var/lib/rbroker-server" in service["ExecStart"]
    assert service["ExecStart"].split()[1] == "serve"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    unit = tmp_path / "rbroker-server.service"
    unit.write_text(UNIT.read_text().replace("/opt/rbroker/bin/rbroker-server", "/bin/true"))
    out = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "rbroker-server.service" not in out.stderr, out.stderr


def test_windows_launchers() -> None:
    cmd = (ROOT / "packaging" / "windows" / "rbroker-server.cmd").read_bytes()
    assert b"\r\n" in cmd and b"\n" not in cmd.replace(b"\r\n", b"")  # CRLF throughout
    assert b"serve" in cmd and b"RBROKER_SERVER_DATA_DIR" in cmd
    ps1 = (ROOT / "packaging" / "windows" / "rbroker-server.ps1").read_text()
    for needle in ("Register-ScheduledTask", '"setup"', "serve", "RBROKER_SERVER_DATA_DIR"):
        assert needle in ps1, needle


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("uv") is None, reason="needs uv to build the wheel")
def test_wheel_carries_the_web_view(tmp_path: Path) -> None:
    """Templates, static files (the vendored chart library with its licence) and migrations
    are package data: the installed coordinator serves its pages from the wheel."""
    import zipfile

    out = subprocess.run(
        ["uv", "build", "--wheel", "--out-dir", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    web = ROOT / "server" / "rbroker_server" / "web"
    for sub in ("templates", "static"):
        for path in (web / sub).iterdir():
            assert f"rbroker_server/web/{sub}/{path.name}" in names, path.name
    assert "rbroker_server/web/static/uPlot.LICENSE.txt" in names
    assert "rbroker_server/db/migrations/versions/2026_11_30_0002_web_sessions.py" in names

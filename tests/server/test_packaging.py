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

"""The broker's systemd units: the system broker's (`rbroker-broker.service`) and the
single-user one (`rbroker-broker-user.service`) verify with `systemd-analyze verify`, and
their command lines are ones `rbroker` accepts."""

from __future__ import annotations

import configparser
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rbroker.cli.main import build_parser

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

ROOT = Path(__file__).resolve().parents[3]
SYSTEM_UNIT = ROOT / "packaging" / "linux" / "rbroker-broker.service"
USER_UNIT = ROOT / "packaging" / "linux" / "rbroker-broker-user.service"
RBROKER = str(Path(sys.executable).with_name("rbroker"))
"""This environment's `rbroker` launcher: the real executable the units' ExecStart= names
stand for in the verification (systemd-analyze checks that it exists)."""

needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="needs systemd-analyze (Debian: systemd)"
)


def _service(unit: Path) -> configparser.SectionProxy:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(unit.read_text())
    return parser["Service"]


def test_the_system_unit_runs_the_system_broker_as_its_own_user() -> None:
    service = _service(SYSTEM_UNIT)
    assert service["User"] == service["Group"] == "rbroker"
    assert service["RuntimeDirectory"] == "rbroker"  # /run/rbroker, for the socket
    assert service["RuntimeDirectoryMode"] == "0755"  # users reach the socket inside it
    assert service["StateDirectory"] == "rbroker"  # /var/lib/rbroker
    argv = shlex.split(service["ExecStart"])
    assert argv[0] == "/opt/rbroker/bin/rbroker"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "broker" and args.system and args.allowed_group == "rbroker"


def test_the_system_unit_is_hardened_without_breaking_the_broker() -> None:
    service = _service(SYSTEM_UNIT)
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "ProtectHome": "yes",
        "CapabilityBoundingSet": "",
        "RestrictSUIDSGID": "yes",
        "UMask": "0077",
    }.items():
        assert service[key] == value, key
    # NVML needs /dev/nvidia*; the machine lock needs the host's network namespace; the
    # broker watches the holders' processes in /proc
    assert service.get("PrivateDevices", "no") == "no"
    assert service.get("PrivateNetwork", "no") == "no"
    assert service.get("ProtectProc", "default") == "default"
    assert "AF_UNIX" in service["RestrictAddressFamilies"]


def test_the_user_unit_runs_a_per_user_broker() -> None:
    argv = shlex.split(_service(USER_UNIT)["ExecStart"])
    assert argv[0] == "%h/.local/bin/rbroker"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "broker" and not args.system and args.socket is None


@needs_analyze
def test_the_system_unit_verifies(tmp_path: Path) -> None:
    unit = tmp_path / "rbroker-broker.service"
    unit.write_text(SYSTEM_UNIT.read_text().replace("/opt/rbroker/bin/rbroker", RBROKER))
    out = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "rbroker-broker.service" not in out.stderr, out.stderr


@needs_analyze
def test_the_user_unit_verifies(tmp_path: Path) -> None:
    unit = tmp_path / "units" / "rbroker-broker.service"
    unit.parent.mkdir()
    unit.write_text(USER_UNIT.read_text().replace("%h/.local/bin/rbroker", RBROKER))
    runtime = tmp_path / "runtime"  # a user manager's runtime dir, which root has none of
    runtime.mkdir(mode=0o700)
    out = subprocess.run(
        ["systemd-analyze", "--user", "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
    )
    assert out.returncode == 0, out.stderr
    assert "rbroker-broker.service" not in out.stderr, out.stderr


@needs_analyze
def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check can fail: a unit naming a missing program does not verify."""
    unit = tmp_path / "rbroker-broker.service"
    unit.write_text(SYSTEM_UNIT.read_text().replace("/opt/rbroker/bin/rbroker", "/nonexistent"))
    out = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0 and "/nonexistent" in out.stderr

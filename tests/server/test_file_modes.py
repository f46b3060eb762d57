"""File modes under the default umask 022: the coordinator's data dir 0700 (an existing one
0750 at most) and its SQLite database, WAL and SHM files 0600, after `setup` and after
`serve`; the broker's data dir and lease database likewise (tests/desktop/test_file_modes.py
is the broker's own check through its host)."""

from __future__ import annotations

import os
import signal
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.ports import free_port

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")

CMD = [sys.executable, "-m", "rbroker_server"]
DB = "rbroker-server.db"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _db_files(data: Path) -> list[Path]:
    return [p for p in (data / DB, data / f"{DB}-wal", data / f"{DB}-shm") if p.exists()]


def _setup(data: Path, port: int, *extra: str, umask: int = 0o022) -> None:
    done = subprocess.run(
        [*CMD, "setup", "--non-interactive", "--data-dir", str(data), "--port", str(port), *extra],
        capture_output=True,
        text=True,
        timeout=90,
        umask=umask,
    )
    assert done.returncode == 0, done.stderr


def _serve_once(data: Path, port: int, log: Path, umask: int = 0o022) -> None:
    """Run `serve` under `umask` until `/healthz` answered 200 (a write), then stop it."""
    https = (data / "tls" / "server.pem").exists()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*CMD, "serve", "--data-dir", str(data)], stdout=out, stderr=out, umask=umask
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    r = httpx.get(
                        f"{'https' if https else 'http'}://127.0.0.1:{port}/healthz",
                        timeout=5,
                        verify=ssl.create_default_context(cafile=data / "tls" / "ca.pem")
                        if https
                        else True,
                    )
                    break
                except httpx.TransportError:
                    assert proc.poll() is None, log.read_text()
                    assert time.monotonic() < deadline, "serve did not answer"
                    time.sleep(0.1)
            assert r.status_code == 200, r.text
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def test_setup_and_serve_keep_the_data_private_under_umask_022(tmp_path: Path) -> None:
    data = tmp_path / "srv"
    port = free_port()
    _setup(data, port)
    assert _mode(data) == 0o700
    assert _mode(data / "config.toml") == 0o600
    assert _db_files(data) and all(_mode(p) == 0o600 for p in _db_files(data))

    _serve_once(data, port, tmp_path / "serve.log")
    files = _db_files(data)
    assert {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}
    assert _mode(data) == 0o700


def test_serve_tightens_files_an_older_version_left_open(tmp_path: Path) -> None:
    data = tmp_path / "srv"
    port = free_port()
    _setup(data, port)
    data.chmod(0o755)
    for p in _db_files(data):
        p.chmod(0o644)
    (data / f"{DB}-shm").touch()
    (data / f"{DB}-shm").chmod(0o644)

    _serve_once(data, port, tmp_path / "serve.log")
    assert _mode(data) == 0o750  # an existing dir keeps its group's read access at most
    files = _db_files(data)
    assert {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}


def test_self_signed_setup_under_umask_000_writes_nothing_others_may_change(
    tmp_path: Path,
) -> None:
    """Before: tls/ca.pem and tls/server.pem were 0666 under umask 000."""
    data = tmp_path / "srv"
    port = free_port()
    _setup(data, port, "--self-signed", "--bind", "127.0.0.1", umask=0o000)
    _serve_once(data, port, tmp_path / "serve.log", umask=0o000)
    modes = {p.relative_to(data).as_posix(): _mode(p) for p in (data, *data.rglob("*"))}
    want = {
        ".": 0o700,
        "config.toml": 0o600,
        "tls": 0o700,
        "tls/ca.pem": 0o644,
        "tls/server.pem": 0o644,
        "tls/server.key": 0o600,
        **{p.name: 0o600 for p in _db_files(data)},
    }
    assert modes == want

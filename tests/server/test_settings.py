"""Settings: saved and loaded from config.toml, validated, never read at import time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rbroker_server.settings import Settings


def test_round_trip(tmp_path: Path) -> None:
    s = Settings(
        data_dir=tmp_path,
        public_hostname='gpu "hub"',
        bind_port=9443,
        stale_after_s=20.0,
        database_url="postgresql+psycopg://u@h:5432/db",
    )
    path = s.save()
    if os.name == "posix":  # Windows keeps access in ACLs, not in the mode
        assert path.stat().st_mode & 0o077 == 0
    assert Settings.load(tmp_path) == s


def test_default_database_is_sqlite_in_the_data_dir(tmp_path: Path) -> None:
    assert (
        Settings(data_dir=tmp_path).db_url
        == f"sqlite:///{(tmp_path / 'rbroker-server.db').resolve().as_posix()}"
    )


def test_invalid_settings(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Settings(stale_after_s=10, offline_after_s=5)
    with pytest.raises(ValueError):
        Settings(tls_cert="a.pem")
    (tmp_path / "config.toml").write_text('surprise = "x"\n')
    with pytest.raises(ValueError, match="unknown settings"):
        Settings.load(tmp_path)


def test_app_module_reads_nothing_at_import() -> None:
    import subprocess
    import sys

    code = (
        "import os; os.environ.pop('RBROKER_SERVER_DATA_DIR', None); "
        "import rbroker_server.app, rbroker_server.cli.main; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"

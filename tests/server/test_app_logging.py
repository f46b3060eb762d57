"""The coordinator leaves the process's logging to whoever runs it: building the app changes
no logger, and `rbroker-server serve` writes its own lines at INFO in its own line format
(`--log-level` sets uvicorn's level, and the coordinator's too when finer than INFO).

Before: Litestar's default logging config took the root logger over when the app was built
(its own handler and format, level INFO), so serve's format was never used, `--log-level
debug` showed none of the coordinator's DEBUG lines, and a coordinator built inside another
program (the tests' own) rewrote that program's logging for good."""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rbroker_server.app import create_app
from rbroker_server.settings import Settings
from tests.ports import free_port


def test_building_the_app_changes_no_logger(tmp_path: Path) -> None:
    root = logging.getLogger()
    before = (root.level, list(root.handlers))
    create_app(Settings(data_dir=tmp_path / "data"))
    assert (root.level, list(root.handlers)) == before


@pytest.mark.skipif(sys.platform == "win32", reason="stopped with SIGINT")
def test_serve_writes_its_own_lines_in_its_format_and_uvicorns_at_the_level(
    tmp_path: Path,
) -> None:
    data = tmp_path / "srv"
    port = free_port()
    Settings(data_dir=data, bind_host="127.0.0.1", bind_port=port).save()
    command = [sys.executable, "-m", "rbroker_server", "serve", "--data-dir", str(data)]
    serve = subprocess.Popen(
        [*command, "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # answering: its start-up lines are written
            assert serve.poll() is None, serve.communicate()[1]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "serve did not answer within 60 s"
                time.sleep(0.1)
    finally:
        serve.send_signal(signal.SIGINT)
        try:
            _, err = serve.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            _, err = serve.communicate()
    schema = [line for line in err.splitlines() if "database schema at revision" in line]
    assert len(schema) == 1, err
    # serve's format, "<date> <time> LEVEL logger: message"; Litestar's was
    # "INFO - <date> <time> - logger - module - message"
    assert re.fullmatch(
        r"\S+ \S+ INFO rbroker_server\.cli: database schema at revision \S+", schema[0]
    ), schema
    assert "Uvicorn running on" not in err and "GET /healthz" not in err, err  # uvicorn's INFO

"""Every `rbroker-server` command meets a database that cannot be reached (a real
PostgreSQL URL where nothing listens, 127.0.0.1:1), a bad port or a bad config with one
line on stderr and a documented exit code (docs/user-guide.md "Exit codes"), never a
traceback; and the coordinator answers `HEAD` wherever it answers `GET`."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rbroker_protocol.startup import EXIT_DATABASE, EXIT_USAGE
from rbroker_server.cli.main import main
from rbroker_server.settings import Settings
from tests.server.conftest import Coordinator

DOWN_URL = "postgresql+psycopg://postgres:secret@127.0.0.1:1/rbroker"
"""A PostgreSQL URL where nothing listens (port 1): connection refused at once."""


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _run(*args: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "rbroker_server", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout, done.stderr


def test_setup_with_the_database_down_is_one_line_and_writes_no_config(tmp_path: Path) -> None:
    data = tmp_path / "srv"
    code, _, err = _run(
        "setup", "--non-interactive", "--data-dir", str(data), "--database-url", DOWN_URL
    )
    line = _one_line(err)
    assert code == EXIT_DATABASE == 15, err
    assert line.startswith(
        "rbroker-server: the database postgresql+psycopg://postgres:***@127.0.0.1:1/rbroker "
        "cannot be opened or migrated: connection failed"
    ), line
    assert "check --database-url" in line and "secret" not in line
    assert not (data / "config.toml").exists()  # a second try needs no --force


@pytest.mark.parametrize(
    "command",
    [
        ["token", "list", "--group", "default"],
        ["token", "create", "--group", "default"],
        ["token", "revoke", "--group", "default", "abc"],
        ["group", "list"],
        ["group", "create", "vision"],
        ["enroll-code", "create", "--group", "default"],
        ["enroll-code", "list", "--group", "default"],
        ["enroll-code", "revoke", "--group", "default", "abc"],
        ["computer", "list"],
        ["computer", "revoke", "abc"],
        ["db", "upgrade"],
    ],
)
def test_admin_commands_with_the_database_down(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "srv"
    Settings(data_dir=data, database_url=DOWN_URL).save()
    assert main([*command, "--data-dir", str(data)]) == EXIT_DATABASE
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(
        "rbroker-server: the database postgresql+psycopg://postgres:***@127.0.0.1:1/rbroker "
        "cannot be opened or migrated: connection failed"
    ), line
    assert f"check database_url in {data / 'config.toml'}" in line


def test_token_list_with_the_database_down_in_a_real_process(tmp_path: Path) -> None:
    data = tmp_path / "srv"
    Settings(data_dir=data, database_url=DOWN_URL).save()
    code, _, err = _run("token", "list", "--group", "default", "--data-dir", str(data))
    assert code == EXIT_DATABASE
    assert "cannot be opened or migrated: connection failed" in _one_line(err)


@pytest.mark.parametrize("url", ["foo", "nosuchdialect://x/y"])
def test_setup_with_a_malformed_database_url(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "srv"
    args = ["setup", "--non-interactive", "--data-dir", str(data), "--database-url", url]
    assert main(args) == EXIT_DATABASE
    assert f"the database {url} cannot be opened" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("port", ["99999", "0", "-1", "http"])
def test_a_bad_port_is_refused_at_setup_and_at_serve(tmp_path: Path, port: str) -> None:
    data = tmp_path / "srv"
    code, _, err = _run("setup", "--non-interactive", "--data-dir", str(data), "--port", port)
    assert code == EXIT_USAGE == 2
    assert _one_line(err) == (
        f"rbroker-server setup: argument --port: not a TCP port: {port!r} (a whole number "
        "from 1 to 65535) (see rbroker-server setup --help)"
    )
    assert not (data / "config.toml").exists()
    Settings(data_dir=data).save()
    code, _, err = _run("serve", "--data-dir", str(data), "--port", port)
    assert code == EXIT_USAGE
    assert "argument --port: not a TCP port" in _one_line(err)


def test_a_bad_port_in_the_config_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "srv"
    Settings(data_dir=data).save()
    config = data / "config.toml"
    config.write_text(config.read_text().replace("bind_port = 8787", "bind_port = 99999"))
    for command in (["serve"], ["group", "list"]):
        code, _, err = _run(*command, "--data-dir", str(data))
        assert code == 1, err
        assert _one_line(err) == (
            f"rbroker-server: {config}: bind_port must be a TCP port from 1 to 65535, not 99999"
        )
    with pytest.raises(ValueError, match="bind_port must be a TCP port"):
        Settings(data_dir=data, bind_port=0)


def test_the_listening_socket_refuses_a_port_past_65535() -> None:
    from rbroker_server.cli.startup import StartupFailure, bind

    with pytest.raises(StartupFailure) as failed:
        bind("127.0.0.1", 99999)
    assert failed.value.code == EXIT_USAGE
    assert failed.value.line == (
        "cannot listen on port 99999: a TCP port is 1 to 65535; choose --port"
    )


def test_head_is_answered_where_get_is(coordinator: Coordinator) -> None:
    for path in ("/healthz", "/signin", "/schema", "/schema/openapi.json", "/static/app.css"):
        got = coordinator.http.get(path)
        head = coordinator.http.head(path)
        assert got.status_code == head.status_code == 200, (path, head.status_code)
        assert head.content == b""
        assert head.headers.get("content-type") == got.headers.get("content-type")
    redirect = coordinator.http.head("/")
    assert redirect.status_code == 303 and redirect.headers["location"] == "/signin"
    # over a raw socket: no body bytes follow the headers, and the connection stays usable
    host, port = coordinator.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while data.count(b"HTTP/1.1 200") < 2 or not data.endswith(b"}"):
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
    first, _, rest = data.partition(b"\r\n\r\n")
    assert rest.startswith(b"HTTP/1.1 200"), data
    assert b"content-length" in first.lower()

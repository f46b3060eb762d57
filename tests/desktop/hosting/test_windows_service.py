"""The Windows service broker (issue 13, item 3), what runs on any OS: its names and data
dir, the command the Service Control Manager is given (the base interpreter, never a venv
launcher, with this installation's site dirs), the service's options, the hosting loop
(the same `BrokerHost` as `rbroker broker`, here on a Unix socket), and the CLI's refusal
off Windows. The service class itself type-checks with `mypy --platform win32`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import rbroker
from rbroker.cli.main import main
from rbroker.hosting.machine_lock import PER_SOCKET
from rbroker.hosting.service_windows import (
    BOOTSTRAP,
    SERVICE_NAME,
    SERVICE_PIPE,
    ServiceOptions,
    frozen_service_command,
    frozen_service_main,
    parse_service_options,
    serve_until,
    service_command,
    service_config,
    service_data_dir,
    this_installation,
)

pytestmark = pytest.mark.contract  # it starts processes or servers of its own


def test_names_and_data_dir() -> None:
    assert SERVICE_NAME == "rbroker"
    assert SERVICE_PIPE == "\\\\.\\pipe\\rbroker"
    assert service_data_dir({"ProgramData": "D:\\Data"}) == Path("D:\\Data") / "rbroker"
    assert service_data_dir({}) == Path("C:\\ProgramData") / "rbroker"
    config = service_config({}, ServiceOptions(headroom_mib=1024))
    assert str(config.socket_path) == SERVICE_PIPE
    assert config.headroom_mib == 1024 and not config.simulate
    assert config.data_dir == Path("C:\\ProgramData") / "rbroker"


def test_service_options() -> None:
    assert parse_service_options([]) == ServiceOptions()
    assert parse_service_options(
        ["--headroom-mib", "2048", "--data-dir", "E:\\rb", "--simulate", "C:\\s.toml"]
    ) == ServiceOptions(2048, Path("E:\\rb"), True, Path("C:\\s.toml"))
    assert parse_service_options(["--simulate", "--headroom-mib", "1"]) == ServiceOptions(
        1, None, True, None
    )
    for bad in (["--headroom-mib", "lots"], ["--headroom-mib"], ["--port", "1"]):
        with pytest.raises(ValueError, match=repr(bad[0])):
            parse_service_options(bad)


def test_registered_command_line() -> None:
    exe, args = service_command(
        "C:\\Python312\\python.exe",
        ["C:\\Users\\ana\\vision\\.venv\\Lib\\site-packages"],
        ["--headroom-mib", "1024"],
    )
    assert exe == "C:\\Python312\\python.exe"
    code = BOOTSTRAP.format(dirs=["C:\\Users\\ana\\vision\\.venv\\Lib\\site-packages"])
    assert args == f'-c "{code}" --headroom-mib 1024'
    assert "\\\\Lib\\\\site-packages" in args  # repr() doubles the backslashes for Python


def test_frozen_app_registers_its_own_service_host() -> None:
    exe, args = frozen_service_command(
        "C:\\Program Files\\rbroker\\rbroker.exe", ["--data-dir", "D:\\rb data"]
    )
    assert exe == "C:\\Program Files\\rbroker\\rbroker-service.exe"
    assert args == '--data-dir "D:\\rb data"'


def test_frozen_service_host_refuses_bad_options_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert frozen_service_main(["--port", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rbroker service: service option '--port'") and err.count("\n") == 1


@pytest.mark.skipif(sys.platform == "win32", reason="on Windows dispatch hosts the service")
def test_base_interpreter_finds_this_installation_through_the_bootstrap() -> None:
    """What the SCM would run, run here: the *base* interpreter (outside any venv) with the
    bootstrap reaches `rbroker.hosting.service_windows.dispatch` of this installation — which, off
    Windows, refuses with exit 2 and names where it was imported from."""
    base, dirs = this_installation()
    assert dirs, "no site-packages dir found"
    exe, _args = service_command(base, dirs, ["--headroom-mib", "64"])
    code = BOOTSTRAP.format(dirs=dirs)
    done = subprocess.run(
        [exe, "-c", code, "--headroom-mib", "64"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},  # no PYTHONPATH, no venv: only the bootstrap's dirs
    )
    assert done.returncode == 2, done.stderr
    assert "runs on Windows only" in done.stderr
    assert str(Path(rbroker.__file__).parent) in done.stderr
    assert "headroom_mib=64" in done.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="a Unix socket; test_windows_pipe_live")
def test_serve_until_hosts_the_broker_and_stops(tmp_path: Path) -> None:
    config = service_config({}, ServiceOptions(data_dir=tmp_path / "data", simulate=True))
    sock = tmp_path / "broker.sock"
    config = dataclasses.replace(config, socket_path=sock, machine_lock=PER_SOCKET)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    ready = threading.Event()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(serve_until(config, stop, ready.set))
    )
    thread.start()
    try:
        assert ready.wait(60)
        with rbroker.Client(str(sock), timeout_s=10) as c:
            assert len(c.gpus()) == 2  # the default simulated scenario
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(60)
    assert not thread.is_alive()
    assert not sock.exists()  # stopped: the socket is gone
    loop.close()


@pytest.mark.skipif(sys.platform == "win32", reason="the refusal off Windows")
@pytest.mark.parametrize("action", ["install", "remove", "start", "stop", "run"])
def test_cli_refuses_off_windows(action: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["service", action]) == 2
    err = capsys.readouterr().err
    assert "works on Windows only" in err and "sudo rbroker broker install-system" in err


def test_service_manager_refusals_say_what_is_wrong_and_what_to_do() -> None:
    from rbroker.cli.service_cmd import refusal_text

    missing = "The specified service does not exist as an installed service."
    assert refusal_text("start", 1060, missing) == (
        "cannot start the rbroker service: it is not installed (Windows: The specified "
        "service does not exist as an installed service, error 1060); install it first: "
        "rbroker service install"
    )
    assert "nothing to stop" in refusal_text("stop", 1060, missing)
    assert "nothing to remove" in refusal_text("remove", 1060, missing)
    assert "installed already" in refusal_text("install", 1073, "exists")
    assert "Run as administrator" in refusal_text("install", 5, "Access is denied.")
    assert "it runs already" in refusal_text("start", 1056, "already running")
    assert "it is not running" in refusal_text("stop", 1062, "not started")
    other = refusal_text("start", 1053, "The service did not respond in a timely fashion.")
    assert other.startswith("Windows refused to start the rbroker service (Windows: The ")
    assert "error 1053" in other
    for text in (refusal_text("start", 1060, missing + "\r\n"), other):
        assert "\n" not in text

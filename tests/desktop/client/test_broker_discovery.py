"""Where clients look for the broker: `--socket`, `RBROKER_SOCKET`, the system broker's
address, the per-user address; `rbroker status` says which answered (architecture.md §5)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import rbroker
from rbroker.client import paths
from rbroker.client.paths import (
    ENV_SOCKET,
    FOUND_ENV,
    FOUND_OPTION,
    FOUND_PER_USER,
    FOUND_SYSTEM,
    Candidate,
    discovery_order,
)
from rbroker.transport import system_paths
from rbroker.transport.system_paths import ENV_SYSTEM_SOCKET
from tests.conftest import BrokerProcess, short_tmp

pytestmark = pytest.mark.contract  # it starts processes or servers of its own


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No RBROKER_SOCKET; the system address and the user runtime dir in a fresh directory
    (nothing listens there yet), removed afterwards. A test that sets a variable sets it
    through `monkeypatch` too: one set on `os.environ` stays for the tests after it."""
    root = short_tmp()
    runtime = root / "xdg"
    runtime.mkdir(mode=0o700)
    monkeypatch.delenv(ENV_SOCKET, raising=False)
    monkeypatch.setenv(ENV_SYSTEM_SOCKET, str(root / "system.sock"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_the_system_addresses_are_the_documented_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SYSTEM_SOCKET, raising=False)
    assert system_paths.SYSTEM_SOCKET_LINUX == "/run/rbroker/broker.sock"
    assert system_paths.SYSTEM_PIPE_WINDOWS == r"\\.\pipe\rbroker"
    assert Path("/var/lib/rbroker") == system_paths.SYSTEM_DATA_DIR_LINUX
    expected = (
        system_paths.SYSTEM_PIPE_WINDOWS if sys.platform == "win32" else "/run/rbroker/broker.sock"
    )
    assert system_paths.system_socket_path() == expected


def test_the_order_is_option_variable_system_per_user(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = str(clean_env / "system.sock")
    per_user = str(clean_env / "xdg" / "rbroker" / "broker.sock")
    assert paths.per_user_socket_path() == per_user
    assert discovery_order() == [
        Candidate(system, FOUND_SYSTEM),
        Candidate(per_user, FOUND_PER_USER),
    ]
    monkeypatch.setenv(ENV_SOCKET, "/from/env.sock")
    assert discovery_order() == [Candidate("/from/env.sock", FOUND_ENV)]
    assert discovery_order("/given.sock") == [Candidate("/given.sock", FOUND_OPTION)]


def test_a_client_finds_the_system_broker_before_the_per_user_one(
    clean_env: Path, broker_factory: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    per_user_root = clean_env / "xdg" / "rbroker"
    per_user_root.mkdir(mode=0o700)
    mine: BrokerProcess = broker_factory(root=per_user_root)  # type: ignore[operator]
    assert mine.socket == paths.per_user_socket_path()
    with rbroker.Client() as c:  # no system broker yet: the per-user one
        assert (c.address, c.found_by) == (mine.socket, FOUND_PER_USER)
    system_root = clean_env / "system"
    system_root.mkdir()
    system: BrokerProcess = broker_factory(root=system_root)  # type: ignore[operator]
    monkeypatch.setenv(ENV_SYSTEM_SOCKET, system.socket)
    with rbroker.Client() as c:
        assert (c.address, c.found_by) == (system.socket, FOUND_SYSTEM)
    monkeypatch.setenv(ENV_SOCKET, mine.socket)  # the variable wins over both
    with rbroker.Client() as c:
        assert (c.address, c.found_by) == (mine.socket, FOUND_ENV)


def _status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rbroker", "status", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_status_says_which_broker_answered_and_how_it_was_found(
    clean_env: Path, broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_SYSTEM_SOCKET, broker.socket)
    done = _status()
    assert done.returncode == 0, done.stderr
    assert f"broker: {broker.socket} (the system broker's address)" in done.stdout
    found = json.loads(_status("--json").stdout)["broker"]
    assert found == {"address": broker.socket, "found_by": FOUND_SYSTEM}
    done = _status("--socket", broker.socket)
    assert f"broker: {broker.socket} (--socket)" in done.stdout
    monkeypatch.setenv(ENV_SOCKET, broker.socket)
    assert f"broker: {broker.socket} (RBROKER_SOCKET)" in _status().stdout


def test_with_no_broker_the_error_names_every_address_tried(clean_env: Path) -> None:
    with pytest.raises(rbroker.BrokerUnavailable) as err:
        rbroker.Client()
    text = str(err.value)
    assert str(clean_env / "system.sock") in text
    assert paths.per_user_socket_path() in text
    assert err.value.code == "broker_unavailable"
    done = _status()
    assert done.returncode == 69
    assert str(clean_env / "system.sock") in done.stderr.replace("\n", "")


@pytest.mark.skipif(sys.platform == "win32", reason="uses SIGTERM")
def test_the_tray_attaches_to_the_system_broker_instead_of_starting_its_own(
    clean_env: Path, broker: BrokerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("PySide6")
    monkeypatch.setenv(ENV_SYSTEM_SOCKET, broker.socket)
    env = {
        **os.environ,
        "QT_QPA_PLATFORM": "offscreen",
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    # --simulate: were it to start its own broker, it could (nothing else stops it here)
    tray = subprocess.Popen(
        [sys.executable, "-m", "rbroker", "tray", "--simulate", "-v"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    watchdog = threading.Timer(60, tray.kill)  # a tray that says neither fails, not hangs
    watchdog.start()
    try:
        assert tray.stdout is not None
        seen: list[str] = []
        for line in tray.stdout:
            seen.append(line)
            if "attached to the broker at" in line or "in-process broker listening" in line:
                break
        assert f"attached to the broker at {broker.socket}" in "".join(seen), seen
        assert not Path(paths.per_user_socket_path()).exists()  # no broker of its own
    finally:
        watchdog.cancel()
        tray.send_signal(signal.SIGTERM)
        try:
            tray.wait(20)
        except subprocess.TimeoutExpired:
            tray.kill()
            tray.wait(5)
        if tray.stdout:
            tray.stdout.close()
    with broker.client() as c:  # the system broker is left running
        assert c.gpus()


@pytest.mark.parametrize("command", ["status", "run", "release", "jobs"])
def test_the_socket_help_of_every_client_command_says_the_discovery_order(command: str) -> None:
    """Before: "default: RBROKER_SOCKET or per-user", though clients try the system broker
    first. Right: the help names the order `discovery_order` follows."""
    done = subprocess.run(
        [sys.executable, "-m", "rbroker", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "400"},  # one line per option
    )
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.strip().startswith("--socket")]
    assert "or per-user" not in line
    order = ["$RBROKER_SOCKET", "system broker's address", "/run/rbroker/broker.sock", "per-user"]
    at = [line.find(word) for word in order]
    assert -1 not in at and at == sorted(at), line
    assert "first that answers" in line


def test_the_brokers_socket_help_says_where_it_listens() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rbroker", "broker", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "400"},
    )
    (line,) = [x for x in done.stdout.splitlines() if x.strip().startswith("--socket")]
    assert "where this broker listens" in line and "$RBROKER_SOCKET, else the per-user" in line


EMPTY_SOCKET_COMMANDS = [
    ["broker", "--simulate"],
    ["status"],
    ["status", "--watch"],
    ["top", "--once"],
    ["run", "--mib", "100", "--", "true"],
    ["release", "lease-1"],
    ["jobs"],
    ["tray", "--attach-only"],
]


@pytest.mark.unit
@pytest.mark.parametrize("argv", EMPTY_SOCKET_COMMANDS, ids=lambda a: a[0])
def test_an_empty_socket_option_is_refused_naming_the_option(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `--socket ''` read as "not given", and the command quietly used the default
    address (`rbroker broker` even listened there). Right: a usage error naming the option."""
    from rbroker.cli.main import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([argv[0], "--socket", "", *argv[1:]])
    assert done.value.code == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "error:" in x]
    assert "argument --socket: an empty address" in line


def test_rbroker_status_with_an_empty_socket_exits_2_with_one_line(clean_env: Path) -> None:
    done = _status("--socket", "")
    assert done.returncode == 2
    assert done.stderr.count("an empty address") == 1 and "Traceback" not in done.stderr
    assert "broker:" not in done.stdout  # it did not go on to the default address


@pytest.mark.unit
def test_an_empty_socket_in_the_sdk_is_refused_and_an_empty_variable_is_unset(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="socket: an empty address"):
        discovery_order("")
    with pytest.raises(ValueError, match="socket: an empty address"):
        rbroker.Client(socket="")
    monkeypatch.setenv(ENV_SOCKET, "")  # the POSIX convention: an empty variable counts as unset
    assert [c.found_by for c in discovery_order()] == [FOUND_SYSTEM, FOUND_PER_USER]
    assert paths.default_socket_path() == paths.per_user_socket_path()

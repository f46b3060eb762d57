"""`rbroker service install|start|stop|remove` through the Service Control Manager, the
service's broker answering on `\\\\.\\pipe\\rbroker` with its data in
`%ProgramData%\\rbroker`, and a client deciding whether to trust it.

Clients trust the service pipe only when its server runs as LocalSystem (the account
`service install` registers). The test reads the account the service process really runs
as and asserts the client's answer for it: served where it is LocalSystem (real Windows);
refused, in one line naming the pid and the account, where it is not (Wine runs services
under the user's own account, so there the refusal is the right answer, and the LocalSystem
acceptance needs real Windows). Either way the service's broker itself answers a raw
`hello` on its pipe.

The whole test runs in this one Windows process tree (Wine stops services when the last
ordinary process of the prefix exits). The service is removed at teardown, also when the
test fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rbroker_protocol.versions import PROTOCOL_VERSION
from tests.windows.cli import assert_one_line, rbroker_cli

pytestmark = pytest.mark.skipif(
    sys.platform != "win32", reason="Windows only: the Service Control Manager"
)

SERVICE_PIPE = r"\\.\pipe\rbroker"
LOCAL_SYSTEM_SID = "S-1-5-18"


def pipe_exists() -> bool:
    import _winapi

    try:
        _winapi.WaitNamedPipe(SERVICE_PIPE, 1)
    except OSError as exc:
        return exc.winerror != 2  # ERROR_FILE_NOT_FOUND: no such pipe
    return True


def wait_for(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.2)


def installed() -> bool:
    import pywintypes
    import win32serviceutil

    try:
        win32serviceutil.QueryServiceStatus("rbroker")
    except pywintypes.error:
        return False
    return True


def raw_hello() -> dict[str, object]:
    """`hello` on the service pipe without the client's account check: what the service's
    broker answers."""
    import _winapi
    import msvcrt

    handle = _winapi.CreateFile(
        SERVICE_PIPE, _winapi.GENERIC_READ | 0x0002, 0, 0, _winapi.OPEN_EXISTING, 0, 0
    )
    with open(msvcrt.open_osfhandle(handle, os.O_BINARY), "r+b", buffering=0) as pipe:
        params = {"protocol_version": PROTOCOL_VERSION, "client": "service-test"}
        request = {"jsonrpc": "2.0", "id": 1, "method": "hello", "params": params}
        pipe.write(json.dumps(request).encode() + b"\n")
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = pipe.read(65536)
            assert chunk, f"the service closed the pipe after {answer!r}"
            answer += chunk
    return dict(json.loads(answer))


@pytest.fixture
def no_service() -> Iterator[None]:
    """No rbroker service before the test (a leftover is removed) and none after it."""
    if pipe_exists() and not installed():
        pytest.skip(f"something else holds {SERVICE_PIPE}")
    if installed():
        rbroker_cli("service", "remove")
    yield
    if installed():
        done = rbroker_cli("service", "remove")
        assert done.returncode == 0, done.stderr


def test_install_start_talk_stop_remove(no_service: None) -> None:
    from rbroker.hosting.service_windows import service_data_dir
    from rbroker.transport.win_accounts import process_account

    # not installed: start, stop and remove say so in one line (exit 1)
    for action in ("start", "stop", "remove"):
        assert_one_line(rbroker_cli("service", action), 1, "it is not installed", "error 1060")

    done = rbroker_cli("service", "install", "--start", "manual", "--simulate")
    assert done.returncode == 0, done.stderr
    assert "installed the 'rbroker' service" in done.stdout
    assert_one_line(rbroker_cli("service", "install", "--simulate"), 1, "installed already")

    database = service_data_dir() / "broker.sqlite3"  # the known folder ProgramData
    for stale in database.parent.glob("broker.sqlite3*"):  # an earlier run's (WAL: the main
        stale.unlink()  # file's mtime need not move when the broker opens it)
    done = rbroker_cli("service", "start")
    assert done.returncode == 0, done.stderr
    assert SERVICE_PIPE in done.stdout
    wait_for(pipe_exists, 60, f"the service's broker listening on {SERVICE_PIPE}")

    answer = raw_hello()
    hello = answer.get("result")
    assert isinstance(hello, dict), answer
    assert hello["simulated"] is True  # `install --simulate` reached the service's broker
    assert database.is_file(), database  # made by this start of the service

    from rbroker.hosting.service_windows import service_pid

    pid = service_pid()
    account_sid, account = process_account(pid)
    status = rbroker_cli("status", "--socket", SERVICE_PIPE, timeout_s=60)
    if account_sid == LOCAL_SYSTEM_SID:  # real Windows: the service is trusted and served
        assert status.returncode == 0, status.stderr
        assert "SIMULATED" in status.stdout
    else:  # Wine: the service runs as this user; the client refuses before sending
        assert_one_line(
            status,
            69,
            f"the pipe {SERVICE_PIPE} is served by pid {pid}",
            f"runs as {account_sid}, not {LOCAL_SYSTEM_SID}",
            "nothing was sent to it",
        )
        assert account.lower().endswith(os.environ["USERNAME"].lower())

    again = rbroker_cli("service", "start")  # what it is asked for is so: 0, as systemctl
    assert again.returncode == 0 and "runs already" in again.stdout, again
    done = rbroker_cli("service", "stop")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: not pipe_exists(), 60, f"{SERVICE_PIPE} gone after the stop")
    wait_for(lambda: "it is not running" in rbroker_cli("service", "stop").stderr, 30, "stopped")

    done = rbroker_cli("service", "remove")
    assert done.returncode == 0, done.stderr
    assert not installed()
    assert_one_line(rbroker_cli("service", "start"), 1, "it is not installed")


def test_service_options_are_checked_before_anything_is_registered(no_service: None) -> None:
    assert_one_line(rbroker_cli("service", "install", "--headroom-mib", "-5"), 2, "--headroom-mib")
    assert not installed()


def test_the_frozen_app_installs_and_hosts_the_service(no_service: None) -> None:
    """The frozen app (tests/windows/frozen.py): its `rbroker.exe service install` registers
    its own host, `rbroker-service.exe`, which the Service Control Manager starts and whose
    broker answers on the service pipe; stop and remove through the frozen command line."""
    import win32service

    from tests.windows.frozen import frozen_exe

    exe = frozen_exe("rbroker")

    def frozen(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [exe, *args], capture_output=True, text=True, timeout=120, check=False
        )

    done = frozen("service", "install", "--start", "manual", "--simulate")
    assert done.returncode == 0, done.stderr
    scm = win32service.OpenSCManager(None, None, win32service.SC_MANAGER_CONNECT)
    try:
        svc = win32service.OpenService(scm, "rbroker", win32service.SERVICE_QUERY_CONFIG)
        try:
            binary = win32service.QueryServiceConfig(svc)[3]
        finally:
            win32service.CloseServiceHandle(svc)
    finally:
        win32service.CloseServiceHandle(scm)
    assert binary == f'"{frozen_exe("rbroker-service")}" --simulate', binary

    done = frozen("service", "start")
    assert done.returncode == 0, done.stderr
    wait_for(pipe_exists, 90, f"the frozen service's broker listening on {SERVICE_PIPE}")
    hello = raw_hello().get("result")
    assert isinstance(hello, dict) and hello["simulated"] is True, hello

    done = frozen("service", "stop")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: not pipe_exists(), 60, f"{SERVICE_PIPE} gone after the stop")
    done = frozen("service", "remove")
    assert done.returncode == 0, done.stderr
    assert not installed()


def installed_products() -> list[str]:
    """The versions of every installed product named rbroker (Programs and Features' list:
    the Uninstall keys of the 64-bit registry view)."""
    import winreg

    found = []
    path = r"SOFTWARE\Microsoft\Windows\CurrentVersion\Uninstall"
    view = winreg.KEY_READ | winreg.KEY_WOW64_64KEY
    with winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE, path, 0, view) as uninstall:
        for i in range(winreg.QueryInfoKey(uninstall)[0]):
            with winreg.OpenKey(uninstall, winreg.EnumKey(uninstall, i), 0, view) as product:
                try:
                    name = winreg.QueryValueEx(product, "DisplayName")[0]
                    version = winreg.QueryValueEx(product, "DisplayVersion")[0]
                except OSError:
                    continue
                if name == "rbroker":
                    found.append(str(version))
    return sorted(found)


def test_the_installer_installs_the_app_and_the_service_and_uninstalls_them(
    no_service: None,
) -> None:
    """dist/windows/rbroker.msi (`bash .ci/wine freeze --msi`), silently: the app in
    ProgramFiles\\rbroker whose `rbroker.exe` runs, the service registered (LocalSystem,
    automatic, `rbroker-service.exe`), the tray in the Start menu, the folder on the system
    PATH; the installed service started through the Service Control Manager answers on its
    pipe (no NVIDIA driver here: its broker fails closed and serves on); a newer installer
    (dist/windows/upgrade-test/rbroker.msi, the next patch version) is an upgrade in place:
    one rbroker installed, at the new version, the service registered, the data kept; the
    silent uninstall removes all of that and keeps %ProgramData%\\rbroker."""
    import winreg

    import win32service

    from rbroker.base.version import __version__
    from rbroker.hosting.service_windows import service_data_dir
    from tests.windows.frozen import REPO

    msi = REPO / "dist" / "windows" / "rbroker.msi"
    newer = REPO / "dist" / "windows" / "upgrade-test" / "rbroker.msi"
    for package in (msi, newer):
        if not package.is_file():
            pytest.skip(f"the installer is not built ({package}): bash .ci/wine freeze --msi")
    folder = Path(os.environ.get("PROGRAMW6432") or os.environ["PROGRAMFILES"]) / "rbroker"
    exe = str(folder / "rbroker.exe")
    # the Start menu of every user (Windows, ALLUSERS=1); Wine puts it in the user's own
    start_menus = [
        Path(os.environ[var], "Microsoft", "Windows", "Start Menu", "Programs", "rbroker.lnk")
        for var in ("PROGRAMDATA", "APPDATA")
    ]
    env_key = r"SYSTEM\CurrentControlSet\Control\Session Manager\Environment"

    def system_path() -> str:
        with winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE, env_key) as key:
            return str(winreg.QueryValueEx(key, "Path")[0])

    def msiexec(action: str, package: Path) -> None:
        done = subprocess.run(
            ["msiexec", action, str(package), "/qn"], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, (action, package, done.returncode, done.stdout, done.stderr)

    def app(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)

    def service_config() -> tuple[object, ...]:
        scm = win32service.OpenSCManager(None, None, win32service.SC_MANAGER_CONNECT)
        try:
            svc = win32service.OpenService(scm, "rbroker", win32service.SERVICE_QUERY_CONFIG)
            try:
                return tuple(win32service.QueryServiceConfig(svc))
            finally:
                win32service.CloseServiceHandle(svc)
        finally:
            win32service.CloseServiceHandle(scm)

    assert installed_products() == [], "an rbroker is installed already"
    kept = service_data_dir() / "kept-by-uninstall.txt"
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text("the service's data: leases, enrollment\n")
    current = msi
    msiexec("/i", msi)
    try:
        assert installed_products() == [__version__]
        for name in ("rbroker.exe", "rbroker-tray.exe", "rbroker-service.exe"):
            assert (folder / name).is_file(), name
        version = app("--version")
        assert version.returncode == 0 and version.stdout.startswith("rbroker "), version
        status = app("status", "--socket", r"\\.\pipe\rbroker-msi-none")
        assert_one_line(status, 69, r"\\.\pipe\rbroker-msi-none")
        assert installed()
        config = service_config()
        assert config[1] == win32service.SERVICE_AUTO_START, config
        assert str(folder / "rbroker-service.exe").lower() in str(config[3]).lower(), config
        assert config[7] == "LocalSystem", config
        assert any(lnk.is_file() for lnk in start_menus), start_menus
        assert str(folder).lower() in system_path().lower(), system_path()

        # the installed service, started as the boot would: its broker answers on the pipe
        done = app("service", "start")
        assert done.returncode == 0, done.stderr
        wait_for(pipe_exists, 90, f"the installed service's broker listening on {SERVICE_PIPE}")
        hello = raw_hello().get("result")
        assert isinstance(hello, dict) and hello["simulated"] is False, hello

        # a newer installer over the running one: an upgrade in place
        msiexec("/i", newer)
        current = newer
        patch = __version__.split(".")
        upgraded = ".".join([*patch[:2], str(int("".join(c for c in patch[2] if c.isdigit())) + 1)])
        assert installed_products() == [upgraded]
        assert installed() and app("--version").returncode == 0
        config = service_config()
        assert str(folder / "rbroker-service.exe").lower() in str(config[3]).lower(), config
        assert kept.is_file(), "the upgrade removed the service's data"
        # and running again when it is removed: nothing of it may stay behind
        done = app("service", "start")
        assert done.returncode == 0, done.stderr
        wait_for(pipe_exists, 90, f"the upgraded service's broker listening on {SERVICE_PIPE}")
    finally:
        msiexec("/x", current)
    assert installed_products() == []
    left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []
    assert left == [], f"the uninstall left {len(left)} files in {folder}: {left[:5]}"
    assert not installed()
    assert not pipe_exists(), "the uninstall left the service's broker running"
    assert not any(lnk.exists() for lnk in start_menus), start_menus
    assert str(folder).lower() not in system_path().lower(), system_path()
    assert kept.is_file(), "the uninstall removed the service's data"
    kept.unlink()

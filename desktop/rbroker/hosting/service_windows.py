"""The broker as a Windows service: one admission authority for every user of a workstation.

`RbrokerService` (pywin32's `win32serviceutil.ServiceFramework`) hosts the same broker as
`rbroker broker` — `rbroker.hosting.host.BrokerHost`, which also takes the machine-wide lock — as
LocalSystem, listening on the fixed pipe `\\\\.\\pipe\\rbroker` (whose access list lets
Authenticated Users connect: `rbroker.transport.pipe_security`), with its data in
`%ProgramData%\\rbroker`, which it secures before using it (`secure_data_dir`: only LocalSystem
and Administrators may read or change it, every user may write the machine lock's identity
in its `locks\\`; `rbroker.hosting.win_acl`).

The Service Control Manager must start the process that calls StartServiceCtrlDispatcher.
A virtual environment's `python.exe` is a launcher that starts the base interpreter as a
child, so the service is registered with the *base* interpreter (`sys._base_executable`)
and a bootstrap that adds this installation's site-packages (with their `.pth` files, which
is how pywin32 finds its DLLs) before importing rbroker: `service_command()`. The frozen app
(packaging/windows/rbroker.spec) has its own host, `rbroker-service.exe` beside
`rbroker.exe`, which runs `frozen_service_main`: `install` from the frozen app registers it
(`frozen_service_command()`).

What is pure here (tested on any OS): the names, `service_data_dir`, `service_locks_dir`,
`service_config`,
`service_command`, and `serve_until` (start the host, wait for the stop event, stop it).
The service class and its install/remove helpers exist on Windows only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import site
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from typing import Any, ClassVar

from rbroker.base.version import __version__
from rbroker.broker.config import CONFIG_FILE, BrokerConfig, ConfigFile, read_config
from rbroker.hosting.win_acl import DataFolderNotTrusted
from rbroker.transport.pipe_security import SERVICE_PIPE
from rbroker.transport.system_paths import program_data_dir

log = logging.getLogger(__name__)

SERVICE_NAME = "rbroker"
DISPLAY_NAME = "rbroker GPU lease broker"
DESCRIPTION = (
    "Admits GPU memory leases for every user of this computer against the GPUs' current "
    "safe capacity (pipe \\\\.\\pipe\\rbroker)."
)


def service_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """`<ProgramData>\\rbroker` (default `C:\\ProgramData\\rbroker`): the service's data;
    ProgramData as `rbroker.transport.system_paths.program_data_dir(environ)` finds it."""
    return program_data_dir(environ) / "rbroker"


def service_locks_dir(data_dir: Path, environ: Mapping[str, str] | None = None) -> Path | None:
    """`<data_dir>\\locks`, where every broker of this computer writes who holds the machine
    lock (`rbroker.hosting.machine_lock_windows`), when `data_dir` is the default
    `service_data_dir(environ)`; None for another data dir (`--data-dir`), whose folder
    holds no locks: `<ProgramData>\\rbroker\\locks` is then left as ProgramData makes it."""
    return data_dir / "locks" if data_dir == service_data_dir(environ) else None


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    """The options a service is registered with (`--headroom-mib`, `--data-dir`,
    `--simulate [FILE]`); `simulate` is for trying the service without a GPU."""

    headroom_mib: int | None = None
    data_dir: Path | None = None
    simulate: bool = False
    scenario: Path | None = None


def service_config(environ: Mapping[str, str] | None, options: ServiceOptions) -> BrokerConfig:
    """The service broker's configuration: the fixed service pipe, the service data dir
    (or the configured one; `environ`: see `service_data_dir`), the configured headroom,
    and `[shares]` and `[members]` of `broker.toml` in the data dir when it exists.

    Raises:
        ValueError: one line naming the config file and its problem (`read_config`).
    """
    data_dir = options.data_dir or service_data_dir(environ)
    settings = ConfigFile()
    if (data_dir / CONFIG_FILE).is_file():
        settings = read_config(data_dir / CONFIG_FILE)
    return BrokerConfig(
        socket_path=Path(SERVICE_PIPE),
        data_dir=data_dir,
        simulate=options.simulate,
        scenario=options.scenario,
        headroom_mib=options.headroom_mib,
        shares=settings.shares,
        members=settings.members,
        bookings=settings.bookings,
        idle_after_s=settings.idle_after_s,
        idle_reclaim=settings.idle_reclaim,
    )


BOOTSTRAP = (
    "import site, sys; [site.addsitedir(d) for d in {dirs!r}]; "
    "from rbroker.hosting.service_windows import dispatch; sys.exit(dispatch(sys.argv[1:]))"
)


def service_command(
    base_executable: str, site_dirs: Sequence[str], options: Sequence[str] = ()
) -> tuple[str, str]:
    """`(exeName, exeArgs)` to register: the base interpreter (never a venv launcher: the
    process the SCM starts must be the one that talks to it), and `-c BOOTSTRAP` with the
    site dirs, then the broker `options` (e.g. `--headroom-mib 1024`), quoted for a Windows
    command line."""
    code = BOOTSTRAP.format(dirs=list(site_dirs))
    return base_executable, subprocess.list2cmdline(["-c", code, *options])


SERVICE_HOST_EXE = "rbroker-service.exe"


def frozen_service_command(executable: str, options: Sequence[str] = ()) -> tuple[str, str]:
    """`(exeName, exeArgs)` to register from the frozen app whose program is `executable`:
    the service host beside it (`SERVICE_HOST_EXE`) and the broker `options`, quoted."""
    host = PureWindowsPath(executable).with_name(SERVICE_HOST_EXE)
    return str(host), subprocess.list2cmdline(options)


def this_installation() -> tuple[str, list[str]]:
    """The base interpreter and the site-packages dirs of the running rbroker."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
    return base, dirs


async def serve_until(
    config: BrokerConfig, stop: asyncio.Event, on_ready: Callable[[], None] | None = None
) -> None:
    """Run the broker of `config` (as `rbroker broker` does) until `stop` is set.

    Raises:
        Whatever `BrokerHost.start` raises (MachineLockHeld, TelemetryError, ...): the
        service reports it and stops.
    """
    from rbroker.hosting.host import BrokerHost

    host = BrokerHost(config)
    await host.start()
    try:
        if on_ready is not None:
            on_ready()
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await host.stop()


def parse_service_options(argv: Sequence[str]) -> ServiceOptions:
    """Parse `--headroom-mib N`, `--data-dir DIR`, `--simulate [FILE]`.

    Raises:
        ValueError: an unknown option or a missing or bad value, named.
    """
    found: dict[str, Any] = {}
    args = list(argv)
    while args:
        opt = args.pop(0)
        if opt == "--headroom-mib" and args and args[0].isdigit():
            found["headroom_mib"] = int(args.pop(0))
        elif opt == "--data-dir" and args:
            found["data_dir"] = Path(args.pop(0))
        elif opt == "--simulate":
            found["simulate"] = True
            if args and not args[0].startswith("--"):
                found["scenario"] = Path(args.pop(0))
        else:
            raise ValueError(
                f"service option {opt!r} is not --headroom-mib N, --data-dir DIR or "
                "--simulate [FILE] (or its value is missing)"
            )
    return ServiceOptions(**found)


def dispatch(argv: Sequence[str]) -> int:
    """What the registered command runs (`BOOTSTRAP`): hand this process to the SCM.

    Returns 0 when the service ends; 2 with a message for bad options, or on another OS.
    """
    try:
        options = parse_service_options(argv)
    except ValueError as exc:
        print(f"rbroker service: {exc}", file=sys.stderr)
        return 2
    if sys.platform == "win32":
        _host_service(options)
        return 0
    print(
        f"rbroker service: the Windows service dispatcher runs on Windows only "
        f"(rbroker {__version__} from {Path(__file__).parent}, options {options})",
        file=sys.stderr,
    )
    return 2


NOT_FROM_SCM = (
    "rbroker-service: the Service Control Manager starts this program; install the service "
    "with `rbroker service install` (as an administrator), then `rbroker service start`"
)
ERROR_FAILED_SERVICE_CONTROLLER_CONNECT = 1063
STOP_WAIT_S = 60.0
"""How long `rbroker service stop` waits for the service's process to end (the broker
writes its last records and the journal on the way out)."""


def frozen_service_main(argv: Sequence[str]) -> int:
    """The frozen service host's entry point (`rbroker-service.exe`): `dispatch`, with one
    line and exit status 2 when a user starts it instead of the Service Control Manager;
    once the service has stopped the process ends at once (`os._exit`, logs flushed)."""
    try:
        code = dispatch(argv)
    except Exception as exc:
        if getattr(exc, "winerror", None) == ERROR_FAILED_SERVICE_CONTROLLER_CONNECT:
            print(NOT_FROM_SCM, file=sys.stderr)
            return 2
        raise
    if sys.platform != "win32" or code != 0:
        return code  # no service ran (bad options, another OS): an ordinary return
    # The service has said it stopped, and the Service Control Manager (or an uninstall
    # waiting for it) takes it as gone: leave now, not after the interpreter's teardown,
    # while this process still holds the folder's DLLs open (an uninstall removing them
    # found them in use and left 44 files in Program Files).
    logging.shutdown()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


if sys.platform == "win32":
    import servicemanager
    import win32service
    import win32serviceutil

    class RbrokerService(win32serviceutil.ServiceFramework):
        """The `rbroker` Windows service (see the module docstring)."""

        _svc_name_ = SERVICE_NAME
        _svc_display_name_ = DISPLAY_NAME
        _svc_description_ = DESCRIPTION
        options: ClassVar[ServiceOptions] = ServiceOptions()

        def __init__(self, args: list[str]) -> None:
            super().__init__(args)
            self._loop: asyncio.AbstractEventLoop | None = None
            self._stop: asyncio.Event | None = None

        def SvcStop(self) -> None:
            self.ReportServiceStatus(win32service.SERVICE_STOP_PENDING)
            if self._loop is not None and self._stop is not None:
                self._loop.call_soon_threadsafe(self._stop.set)

        def SvcDoRun(self) -> None:
            try:
                secure_data_dir(self.options.data_dir or service_data_dir())
                config = service_config(None, self.options)
            except (ValueError, DataFolderNotTrusted) as exc:
                # a bad broker.toml, a data folder another account owns: one line in the log
                servicemanager.LogErrorMsg(f"rbroker broker cannot start: {exc}")
                raise

            async def main() -> None:
                self._loop = asyncio.get_running_loop()
                self._stop = asyncio.Event()
                await serve_until(
                    config,
                    self._stop,
                    lambda: servicemanager.LogInfoMsg(
                        f"rbroker broker listening on {SERVICE_PIPE}, data in {config.data_dir}"
                    ),
                )

            try:
                asyncio.run(main())
            except Exception as exc:
                servicemanager.LogErrorMsg(f"rbroker broker stopped: {type(exc).__name__}: {exc}")
                raise

    def secure_data_dir(data_dir: Path) -> None:
        """Check the owners of the service's `data_dir` and of what is in it, then give it
        (and its `locks\\`: `service_locks_dir`) the service's access lists; makes them
        where missing (`rbroker.hosting.win_acl.secure_service_folder`).

        Raises:
            DataFolderNotTrusted: one line naming the path, its owner and what to do.
            OSError, pywintypes.error: the folder cannot be made or its security set.
        """
        from rbroker.hosting import win_acl
        from rbroker.transport import win_accounts

        win_acl.secure_service_folder(
            data_dir,
            service_locks_dir(data_dir),
            own_sid=win_accounts.own_sid(),
            read_owner=win_acl.read_owner,
            set_dacl=win_acl.set_dacl,
        )

    def _host_service(options: ServiceOptions) -> None:
        RbrokerService.options = options
        servicemanager.Initialize()
        servicemanager.PrepareToHostSingle(RbrokerService)
        servicemanager.StartServiceCtrlDispatcher()

    def install(options: Sequence[str], start: str) -> None:
        """Secure the service's data folder (`secure_data_dir`, so that it is made by an
        administrator before any user can make it), then register the service (`start`:
        `auto`, `delayed` or `manual`), as LocalSystem.

        Raises:
            ValueError: a bad option.
            DataFolderNotTrusted: the data folder, or something in it, has another owner.
            pywintypes.error: e.g. not run as an administrator, or already installed.
        """
        parsed = parse_service_options(options)  # refuse bad options before registering them
        secure_data_dir(parsed.data_dir or service_data_dir())
        if getattr(sys, "frozen", False):  # the frozen app: its own service host
            exe, args = frozen_service_command(sys.executable, options)
        else:
            exe, args = service_command(*this_installation(), options)
        win32serviceutil.InstallService(
            f"{__name__}.RbrokerService",
            SERVICE_NAME,
            DISPLAY_NAME,
            startType=(
                win32service.SERVICE_DEMAND_START
                if start == "manual"
                else win32service.SERVICE_AUTO_START
            ),
            exeName=exe,
            exeArgs=args,
            description=DESCRIPTION,
            delayedstart=start == "delayed",
        )

    def remove() -> None:
        """Stop the service if it runs, then unregister it."""
        with contextlib.suppress(Exception):
            win32serviceutil.StopService(SERVICE_NAME)
        win32serviceutil.RemoveService(SERVICE_NAME)

    def start_service() -> None:
        """Ask the SCM to start the installed service."""
        win32serviceutil.StartService(SERVICE_NAME)

    def stop_service(wait_s: float = STOP_WAIT_S) -> bool:
        """Ask the SCM to stop the service and wait up to `wait_s` for its process to end
        (not only for it to say it stopped: an uninstall that removes the files next finds
        none in use). Returns False when the process still ran after `wait_s`.

        Raises:
            pywintypes.error: the SCM refused (not installed, not running, access denied).
        """
        import win32api
        import win32con
        import win32event

        pid = service_pid()
        handle = None
        if pid:
            with contextlib.suppress(Exception):  # gone already, or not ours to wait on
                handle = win32api.OpenProcess(win32con.SYNCHRONIZE, False, pid)
        try:
            win32serviceutil.StopService(SERVICE_NAME)
            if handle is None:
                return True
            ended = win32event.WaitForSingleObject(handle, int(wait_s * 1000))
            return ended == win32event.WAIT_OBJECT_0
        finally:
            if handle is not None:
                win32api.CloseHandle(handle)

    def service_pid() -> int:
        """The service's process id (0 when it is not running)."""
        scm = win32service.OpenSCManager(None, None, win32service.SC_MANAGER_CONNECT)
        try:
            svc = win32service.OpenService(scm, SERVICE_NAME, win32service.SERVICE_QUERY_STATUS)
            try:
                status: Any = win32service.QueryServiceStatusEx(svc)
                return int(status["ProcessId"])
            finally:
                win32service.CloseServiceHandle(svc)
        finally:
            win32service.CloseServiceHandle(scm)

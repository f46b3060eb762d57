"""`rbroker service install|remove|start|stop|run`: the broker as a Windows service.

On a shared Windows workstation one service broker (LocalSystem, pipe `\\\\.\\pipe\\rbroker`,
data in `%ProgramData%\\rbroker`) admits every user's leases; see
`rbroker.hosting.service_windows`. On any other OS the command refuses and names what to use.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from rbroker.hosting.win_acl import DataFolderNotTrusted
from rbroker.transport.base import BrokerAlreadyRunning, MachineLockHeld
from rbroker_protocol.startup import (
    EXIT_BROKER_ALREADY_RUNNING,
    EXIT_CANNOT_START,
    EXIT_USAGE,
    one_line,
)

NOT_WINDOWS = (
    "`rbroker service` installs the Windows service and works on Windows only; on Linux "
    "install the system broker instead: sudo rbroker broker install-system (systemd)"
)


def add_service_arguments(s: argparse.ArgumentParser) -> None:
    """The description and the arguments of the `service` subcommand (`s`, made by
    `rbroker.cli.main.build_parser` with its help line)."""
    s.description = (
        "Install, remove, start, stop or run the rbroker Windows service: one "
        "broker for every user of this computer, as LocalSystem on \\\\.\\pipe\\rbroker. "
        "install/remove/start/stop need an administrator's console."
    )
    s.add_argument("action", choices=("install", "remove", "start", "stop", "run"))
    s.add_argument(
        "--start",
        dest="start_type",
        choices=("auto", "delayed", "manual"),
        default="auto",
        help="install: when Windows starts it (default auto: at boot)",
    )
    s.add_argument("--headroom-mib", type=int, help="headroom per GPU (default max(512, 5%%))")
    s.add_argument(
        "--data-dir", type=Path, help="state directory (default %%ProgramData%%\\rbroker)"
    )
    s.add_argument(
        "--simulate",
        nargs="?",
        const="",
        default=None,
        metavar="SCENARIO.toml",
        help="run: simulated GPUs (to try the service without a GPU)",
    )


def _fail(code: int, text: str) -> int:
    print(f"rbroker: {one_line(text)}", file=sys.stderr)
    return code


def _options(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    if args.headroom_mib is not None:
        out += ["--headroom-mib", str(args.headroom_mib)]
    if args.data_dir is not None:
        out += ["--data-dir", str(args.data_dir)]
    if args.simulate is not None:
        out += ["--simulate", *([args.simulate] if args.simulate else [])]
    return out


def run_service(args: argparse.Namespace) -> int:
    """Exit codes: 0 done, 1 Windows refused (not an administrator, not installed, ...: one
    line from `refusal_text`) or the data folder has an owner other than LocalSystem or
    Administrators (`install` and `run`: one line naming it), 2 not Windows or bad options."""
    if sys.platform != "win32":
        return _fail(EXIT_USAGE, NOT_WINDOWS)
    import pywintypes

    from rbroker.hosting import service_windows as svc

    try:
        if args.action == "install":
            svc.install(_options(args), args.start_type)
            print(f"installed the {svc.SERVICE_NAME!r} service; start it: rbroker service start")
        elif args.action == "remove":
            svc.remove()
            print(f"removed the {svc.SERVICE_NAME!r} service")
        elif args.action == "start":
            try:
                svc.start_service()
            except pywintypes.error as exc:
                if exc.winerror != ERROR_SERVICE_ALREADY_RUNNING:
                    raise
                # what it was asked for is so (as systemctl start says 0 for a running unit)
                print(f"the rbroker service runs already; its pipe is {svc.SERVICE_PIPE}")
                return 0
            print(f"started; every user's clients find it at {svc.SERVICE_PIPE}")
        elif args.action == "stop":
            if not svc.stop_service():
                return _fail(
                    EXIT_CANNOT_START,
                    f"asked the rbroker service to stop, but its process still ran after "
                    f"{svc.STOP_WAIT_S:g} s; look at it in Task Manager",
                )
            print("stopped")
        else:
            options = svc.parse_service_options(_options(args))
            svc.secure_data_dir(options.data_dir or svc.service_data_dir())
            config = svc.service_config(None, options)
            import asyncio  # here: every command's parser is built from this module

            stop = asyncio.Event()
            print(f"rbroker service broker on {svc.SERVICE_PIPE} (Ctrl-C stops)")
            with contextlib.suppress(KeyboardInterrupt):
                asyncio.run(svc.serve_until(config, stop))
    except MachineLockHeld as exc:
        return _fail(EXIT_BROKER_ALREADY_RUNNING, f"{exc}; not starting a second one")
    except BrokerAlreadyRunning as exc:
        return _fail(EXIT_CANNOT_START, f"{exc}; not starting a second one")
    except DataFolderNotTrusted as exc:
        return _fail(EXIT_CANNOT_START, str(exc))
    except ValueError as exc:
        return _fail(EXIT_USAGE, str(exc))
    except pywintypes.error as exc:
        return _fail(EXIT_CANNOT_START, refusal_text(args.action, exc.winerror, exc.strerror))
    return 0


ERROR_ACCESS_DENIED = 5
ERROR_SERVICE_ALREADY_RUNNING = 1056
ERROR_SERVICE_DOES_NOT_EXIST = 1060
ERROR_SERVICE_NOT_ACTIVE = 1062
ERROR_SERVICE_MARKED_FOR_DELETE = 1072
ERROR_SERVICE_EXISTS = 1073


def refusal_text(action: str, winerror: int, strerror: str) -> str:
    """The one line for the Service Control Manager refusing `action` (`install`, `remove`,
    `start`, `stop`) with Windows error `winerror` (`strerror`: Windows' own words): what is
    wrong and what to do, the error number kept for searching."""
    said = f"(Windows: {strerror.strip().rstrip('.')}, error {winerror})"
    name = "the rbroker service"
    if winerror == ERROR_SERVICE_DOES_NOT_EXIST:
        fix = {
            "remove": "nothing to remove",
            "start": "install it first: rbroker service install",
            "stop": "nothing to stop",
        }.get(action, "install it: rbroker service install")
        return f"cannot {action} {name}: it is not installed {said}; {fix}"
    if winerror == ERROR_SERVICE_EXISTS:
        return (
            f"cannot install {name}: it is installed already {said}; to change its options, "
            "rbroker service remove, then install again"
        )
    if winerror == ERROR_SERVICE_MARKED_FOR_DELETE:
        return (
            f"cannot {action} {name}: it is being removed {said}; close the Services console "
            "and anything else that has it open, then try again"
        )
    if winerror == ERROR_SERVICE_ALREADY_RUNNING:
        return f"cannot start {name}: it runs already {said}"
    if winerror == ERROR_SERVICE_NOT_ACTIVE:
        return f"cannot stop {name}: it is not running {said}"
    if winerror == ERROR_ACCESS_DENIED:
        return (
            f"not allowed to {action} {name} {said}: install, remove, start and stop need an "
            "administrator's console (Run as administrator)"
        )
    return f"Windows refused to {action} {name} {said}"

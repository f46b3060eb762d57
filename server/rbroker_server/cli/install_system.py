"""`rbroker-server install-system` and `uninstall-system`: the coordinator as a systemd
service (packaging/linux/rbroker-server.service) installed and removed in one command each, as
the broker's (`rbroker_protocol.system_install`; docs/operator-guide.md, "Linux (systemd)")."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from rbroker_server import __version__
from rbroker_server.cli.common import CliError
from rbroker_server.settings import CONFIG_NAME

EXIT_FAILED, EXIT_USAGE = 1, 2
UNIT = "rbroker-server.service"
ACCOUNT = "rbroker-server"
STATE_DIR = "/var/lib/rbroker-server"


def add_arguments(install: argparse.ArgumentParser, uninstall: argparse.ArgumentParser) -> None:
    install.add_argument(
        "--exec",
        metavar="PATH",
        help="the installed rbroker-server program the unit runs (default: this one)",
    )
    uninstall.add_argument(
        "--purge",
        action="store_true",
        help=f"also remove {STATE_DIR} (the config, the database, the TLS files)",
    )
    for p in (install, uninstall):
        p.add_argument(
            "--dry-run", action="store_true", help="say what it would do, change nothing"
        )
        p.add_argument(
            "--root",
            type=Path,
            default=Path("/"),
            metavar="DIR",
            help="for packagers (like DESTDIR): the files go under DIR, naming their final "
            "paths; systemd is not told (the account is still made on this computer)",
        )


def _on_linux(command: str) -> None:
    """Raises CliError (one line) off Linux: `rbroker_protocol.system_install`, which the
    commands import only after this, is Linux's alone (importing it elsewhere fails, and
    the parser of every command is built on Windows too)."""
    if sys.platform == "win32":
        raise CliError(
            f"{command} is for Linux; on Windows the coordinator runs as the operator guide's "
            "Windows section says (packaging/windows/rbroker-server.ps1)",
            EXIT_USAGE,
        )


def cmd_install_system(args: argparse.Namespace) -> int:
    """Exit codes: 0 done; 1 a step failed; 2 bad input, not root or not Linux (one line)."""
    _on_linux("rbroker-server install-system")
    from rbroker_protocol import system_install as si

    try:
        si.refuse_unless_root("rbroker-server install-system", dry_run=args.dry_run)
        program = si.entry_point("rbroker-server", "rbroker_server", args.exec)
        if args.root == Path("/"):
            si.check_runnable(program, ACCOUNT, "rbroker-server", "rbroker-*.whl[server]")
        configured = (si_path(args.root, STATE_DIR) / CONFIG_NAME).is_file()
        service = si.Service(
            unit=UNIT,
            account=ACCOUNT,
            exec_start=[*program, "serve", "--data-dir", STATE_DIR],
            directories=[si.Directory(STATE_DIR, 0o750, state=True)],
            start=configured,
        )
        si.install(
            service,
            si.unit_template(UNIT),
            __version__,
            root=args.root,
            dry_run=args.dry_run,
        )
    except si.InstallError as exc:
        raise CliError(str(exc), EXIT_USAGE if exc.usage else EXIT_FAILED) from exc
    except OSError as exc:  # a file it reads (the unit, the data dir) that cannot be read
        where = f" ({exc.filename})" if exc.filename else ""
        raise CliError(f"{args.command}: {exc.strerror or exc}{where}") from exc
    if not configured:
        setup = [*program, "setup", "--data-dir", STATE_DIR, "--public-hostname", "HOST"]
        print(
            f"not started: {STATE_DIR} has no {CONFIG_NAME} yet; set it up as the service's "
            f"account, then start it: runuser -u {ACCOUNT} -- {shlex.join(setup)} "
            f"--self-signed && systemctl start {UNIT}"
        )
    return 0


def cmd_uninstall_system(args: argparse.Namespace) -> int:
    """Exit codes: 0 done (or nothing installed); 1 a step failed; 2 not root or not Linux."""
    _on_linux("rbroker-server uninstall-system")
    from rbroker_protocol import system_install as si

    try:
        si.refuse_unless_root("rbroker-server uninstall-system", dry_run=args.dry_run)
        si.uninstall(UNIT, [STATE_DIR], [], root=args.root, purge=args.purge, dry_run=args.dry_run)
    except si.InstallError as exc:
        raise CliError(str(exc), EXIT_USAGE if exc.usage else EXIT_FAILED) from exc
    except OSError as exc:  # a file it reads (the unit, the data dir) that cannot be read
        where = f" ({exc.filename})" if exc.filename else ""
        raise CliError(f"{args.command}: {exc.strerror or exc}{where}") from exc
    return 0


def si_path(root: Path, path: str) -> Path:
    return root / path.lstrip("/")

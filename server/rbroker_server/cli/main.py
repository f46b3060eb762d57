"""The `rbroker-server` command's parser and dispatch: setup, serve, group, enroll-code,
token, computer, webhook, audit, db (one module each in this package).

Every command takes `--data-dir` (default: `$RBROKER_SERVER_DATA_DIR`, else the user's
data directory), which holds `config.toml` written by `setup`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from rbroker_protocol.startup import one_line, os_error_code, os_error_text
from rbroker_server import __version__
from rbroker_server.cli.audit import cmd_audit
from rbroker_server.cli.common import CliError, parse_duration, port_number
from rbroker_server.cli.computer import cmd_computer
from rbroker_server.cli.db_cmd import cmd_db
from rbroker_server.cli.enroll_code import cmd_enroll_code
from rbroker_server.cli.group import cmd_group
from rbroker_server.cli.serve import cmd_serve
from rbroker_server.cli.setup import cmd_setup
from rbroker_server.cli.token import cmd_token
from rbroker_server.cli.webhook import cmd_webhook

if TYPE_CHECKING:
    from rbroker_server.cli.startup import StartupFailure

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_MISSING_EXTRA = 1
"""The `[server]` extra is not installed (docs/user-guide.md, "Exit codes when a command
cannot start")."""

SERVER_MODULES = (
    "sqlalchemy",
    "sqlmodel",
    "alembic",
    "litestar",
    "uvicorn",
    "jinja2",
    "cryptography",
    "prometheus_client",
)
"""Modules of the `[server]` extra that every subcommand may import (pyproject.toml),
checked before any command runs. psycopg, imported only for a PostgreSQL `database_url`,
gets the same one line when its import fails."""


def missing_server_modules() -> list[str]:
    """The `SERVER_MODULES` that cannot be imported here (found without importing them)."""
    missing = []
    for name in SERVER_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def missing_extra_line(missing: list[str]) -> str:
    """One line saying that the `[server]` extra is missing (`missing`: module names) and
    how to install it: from the wheel a clone builds (`uv build`), or in the clone itself
    (rbroker is on no package index)."""
    return (
        f"the coordinator needs rbroker[server], whose extra is not installed (no module "
        f"{', '.join(missing)}): pip install 'dist/rbroker-{__version__}-py3-none-any.whl"
        "[server]' (the wheel `uv build` makes in a clone), or pip install '.[server]' in "
        "the clone (installed with uv tool or pipx: uv tool install --force, or pipx install "
        "--force, with the same wheel and [server])"
    )


def default_data_dir() -> Path:
    """`$RBROKER_SERVER_DATA_DIR`, else the platform's per-user data directory."""
    env = os.environ.get("RBROKER_SERVER_DATA_DIR")
    if env:
        return Path(env)
    import platformdirs

    return platformdirs.user_data_path("rbroker-server", appauthor=False)


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments: one line naming the problem (and `--help`), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    common = OneLineParser(add_help=False)
    common.add_argument(
        "--data-dir",
        type=Path,
        default=argparse.SUPPRESS,
        help="directory with config.toml (default: $RBROKER_SERVER_DATA_DIR or the user data dir)",
    )
    parser = OneLineParser(
        prog="rbroker-server", description="rbroker coordinator", parents=[common]
    )
    parser.add_argument("--version", action="version", version=f"rbroker-server {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(
        name: str, func: Callable[[argparse.Namespace], int], help: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, parents=[common])
        p.set_defaults(func=func)
        return p

    setup = add("setup", cmd_setup, "write the config, create the database, a group and tokens")
    setup.add_argument(
        "--public-hostname",
        help="the name computers use to reach it (default: this machine's name; localhost "
        "when --bind is a loopback address)",
    )
    setup.add_argument("--bind", default="0.0.0.0", help="bind address (default 0.0.0.0)")
    setup.add_argument(
        "--port", type=port_number, default=8787, help="TCP port, 1-65535 (default 8787)"
    )
    setup.add_argument("--tls-cert", help="PEM certificate (chain) file")
    setup.add_argument("--tls-key", help="PEM private key file")
    setup.add_argument(
        "--self-signed", action="store_true", help="generate a CA and a server certificate"
    )
    setup.add_argument("--san", action="append", help="extra DNS name or IP for --self-signed")
    setup.add_argument("--database-url", help="e.g. postgresql+psycopg://user@host:5432/rbroker")
    setup.add_argument("--group", default="default", help="name of the first group")
    setup.add_argument(
        "--external-url",
        help="the URL behind a reverse proxy, e.g. https://lab.example.org/rbroker/",
    )
    setup.add_argument(
        "--trusted-proxy",
        action="append",
        help="address or network of a reverse proxy whose X-Forwarded-For is believed",
    )
    setup.add_argument(
        "--trusted-proxy-secret",
        help="believe X-Forwarded-For only with this value in X-Rbroker-Proxy-Secret, which "
        "the proxy sets (e.g. `openssl rand -hex 32`); without it any process on the "
        "proxy's address is believed",
    )
    setup.add_argument("--non-interactive", action="store_true", help="never prompt")
    setup.add_argument("--force", action="store_true", help="rewrite an existing config")

    from rbroker_server.cli import install_system

    install = sub.add_parser(
        "install-system",
        help="install the coordinator as a systemd service (Linux, as root)",
        description=f"Make the service account {install_system.ACCOUNT} (no login) and "
        f"{install_system.STATE_DIR} (0750), write the unit {install_system.UNIT} running this "
        "rbroker-server, enable it, and (re)start it when systemd runs and the data dir has "
        "its config.toml (else it says the setup command to run first). Run again it upgrades "
        "in place and keeps the data dir.",
        epilog="exit codes: 0 done; 1 a step failed (the line names it); 2 bad input, not root "
        "or not Linux",
    )
    install.set_defaults(func=install_system.cmd_install_system)
    uninstall = sub.add_parser(
        "uninstall-system",
        help="stop and remove the coordinator's systemd service (keeps its data dir)",
        description=f"Stop, disable and remove {install_system.UNIT} and the account its "
        f"install made; {install_system.STATE_DIR} is kept unless --purge.",
        epilog="exit codes: 0 done (or nothing installed); 1 a step failed; 2 not root or not "
        "Linux",
    )
    uninstall.set_defaults(func=install_system.cmd_uninstall_system)
    install_system.add_arguments(install, uninstall)

    serve = add("serve", cmd_serve, "serve the coordinator (HTTPS when configured)")
    serve.add_argument("--host", help="override the configured bind address")
    serve.add_argument("--port", type=port_number, help="override the configured port (1-65535)")
    serve.add_argument("--log-level", default="info")

    group = add("group", cmd_group, "create or list groups")
    gsub = group.add_subparsers(dest="action", required=True)
    gsub.add_parser("create", parents=[common]).add_argument("name")
    gsub.add_parser("list", parents=[common])

    code = add("enroll-code", cmd_enroll_code, "make, list or revoke one-time enrollment codes")
    csub = code.add_subparsers(dest="action", required=True)
    ccreate = csub.add_parser("create", parents=[common], help="make a one-time code")
    ccreate.add_argument("--group", required=True, help="the group it enrolls into")
    ccreate.add_argument("--ttl", type=parse_duration, help="lifetime, e.g. 30m, 24h (24h)")
    clist = csub.add_parser("list", parents=[common], help="the group's unused codes")
    clist.add_argument("--group", required=True, help="the group")
    clist.add_argument("--all", action="store_true", help="also used and expired codes")
    crevoke = csub.add_parser("revoke", parents=[common], help="make an unused code unusable")
    crevoke.add_argument("--group", required=True, help="the group")
    crevoke.add_argument("code", help="code id (from list) or the whole code")

    token = add("token", cmd_token, "create, list or revoke viewer tokens")
    tsub = token.add_subparsers(dest="action", required=True)
    tcreate = tsub.add_parser("create", parents=[common])
    tcreate.add_argument("--group", required=True)
    tcreate.add_argument("--name", help="a label (who or what uses it)")
    trevoke = tsub.add_parser("revoke", parents=[common])
    trevoke.add_argument("--group", required=True)
    trevoke.add_argument("token", help="token id or the whole token")
    tsub.add_parser("list", parents=[common]).add_argument("--group", required=True)

    computer = add("computer", cmd_computer, "list or revoke enrolled computers")
    msub = computer.add_subparsers(dest="action", required=True)
    msub.add_parser("list", parents=[common]).add_argument("--group")
    msub.add_parser("revoke", parents=[common]).add_argument("computer_id")

    hook = add("webhook", cmd_webhook, "add, list or remove a group's webhooks")
    hsub = hook.add_subparsers(dest="action", required=True)
    hadd = hsub.add_parser("add", parents=[common], help="POST a group's events to a URL")
    hadd.add_argument("--group", required=True, help="the group whose events it gets")
    hadd.add_argument("url", help="http:// or https:// URL (a chat's incoming webhook)")
    hadd.add_argument(
        "--events", required=True, help="comma-separated: computer_offline,computer_back,…"
    )
    hadd.add_argument(
        "--waiting-after",
        type=parse_duration,
        default=600.0,
        help="request_waiting: a request waiting longer than this (10m)",
    )
    hadd.add_argument(
        "--idle-after",
        type=parse_duration,
        default=1800.0,
        help="lease_idle: a lease its broker measured idle longer than this (30m)",
    )
    hlist = hsub.add_parser("list", parents=[common], help="the webhooks (never a secret)")
    hlist.add_argument("--group", help="only this group's")
    hlist.add_argument("--json", action="store_true", help="as JSON")
    hsub.add_parser("remove", parents=[common], help="remove one and its deliveries").add_argument(
        "id", type=int, help="webhook id (from list)"
    )

    trail = add("audit", cmd_audit, "the audit trail: enrollments, tokens, sign-ins, …")
    trail.add_argument("--group", help="only this group's entries")
    trail.add_argument(
        "--limit", type=int, default=50, help="the newest N entries (50; at most 10000)"
    )
    trail.add_argument("--json", action="store_true", help="as JSON")

    dbp = add("db", cmd_db, "database schema")
    dsub = dbp.add_subparsers(dest="action", required=True)
    dsub.add_parser("upgrade", parents=[common])
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `rbroker-server`."""
    args = build_parser().parse_args(argv)
    missing = missing_server_modules()
    if missing:  # the base wheel: one line naming the extra, never a traceback
        print(f"rbroker-server: {missing_extra_line(missing)}", file=sys.stderr)
        return EXIT_MISSING_EXTRA
    if not hasattr(args, "data_dir"):
        args.data_dir = default_data_dir()
    from rbroker_server.admin.errors import AdminError
    from rbroker_server.cli.startup import StartupFailure

    try:
        return int(args.func(args))
    except StartupFailure as exc:
        print(f"rbroker-server: {exc.line}", file=sys.stderr)
        return exc.code
    except (CliError, AdminError, ValueError) as exc:
        print(f"rbroker-server: {one_line(str(exc))}", file=sys.stderr)
        return exc.code if isinstance(exc, CliError) else EXIT_FAILED
    except OSError as exc:  # e.g. the data dir or config.toml cannot be read or written
        print(
            f"rbroker-server: {os_error_text(exc)}; check --data-dir ({args.data_dir}) and "
            "that this user may use it",
            file=sys.stderr,
        )
        return os_error_code(exc)
    except ModuleNotFoundError as exc:  # a module of the extra removed since the check
        if (exc.name or "").partition(".")[0] not in (*SERVER_MODULES, "psycopg"):
            raise
        print(f"rbroker-server: {missing_extra_line([exc.name or ''])}", file=sys.stderr)
        return EXIT_MISSING_EXTRA
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a database fault after the database was opened
        failure = _database_fault(args, exc)
        if failure is None:
            raise
        print(f"rbroker-server: {failure.line}", file=sys.stderr)
        return failure.code


def _database_fault(args: argparse.Namespace, exc: Exception) -> StartupFailure | None:
    """The one line for `exc` when it is a SQLAlchemy error (the database went away in the
    middle of a command), else None."""
    import sqlalchemy as sa

    from rbroker_server.cli.startup import database_failure

    if not isinstance(exc, sa.exc.SQLAlchemyError):
        return None
    url = getattr(args, "db_url", "") or "(configured)"
    return database_failure(url, exc, getattr(args, "db_where", "database_url in config.toml"))


if __name__ == "__main__":
    sys.exit(main())

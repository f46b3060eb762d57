"""The `rbroker-server` command: setup, serve, group, enroll-code, token, computer, db.

Every command takes `--data-dir` (default: `$RBROKER_SERVER_DATA_DIR`, else the user's
data directory), which holds `config.toml` written by `setup`.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from rbroker_protocol.files import private_dir
from rbroker_protocol.startup import one_line, os_error_code, os_error_text
from rbroker_server import __version__
from rbroker_server.settings import CONFIG_NAME, PORT_MAX, PORT_MIN, Settings

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from rbroker_server.startup import StartupFailure

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


class CliError(Exception):
    """A failure to report as one line on stderr."""


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
        "the clone"
    )


def default_data_dir() -> Path:
    """`$RBROKER_SERVER_DATA_DIR`, else the platform's per-user data directory."""
    env = os.environ.get("RBROKER_SERVER_DATA_DIR")
    if env:
        return Path(env)
    import platformdirs

    return platformdirs.user_data_path("rbroker-server", appauthor=False)


def parse_duration(text: str) -> float:
    """`90`, `90s`, `30m`, `24h`, `7d` → seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 30m, 24h, 7d)")
    unit = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    return float(m.group(1)) * unit


def _fmt_time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "-"


def _load(args: argparse.Namespace) -> Settings:
    data_dir = Path(args.data_dir)
    if not (data_dir / CONFIG_NAME).exists():
        raise CliError(
            f"no {CONFIG_NAME} in {data_dir}: pass --data-dir DIR (or set "
            "RBROKER_SERVER_DATA_DIR) to the directory that `rbroker-server setup` wrote, or "
            "run `rbroker-server setup` first"
        )
    return Settings.load(data_dir)


def port_number(text: str) -> int:
    """`--port`: a TCP port, 1–65535 (argparse type; a bad one exits 2 with one line)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not PORT_MIN <= port <= PORT_MAX:
        raise argparse.ArgumentTypeError(
            f"not a TCP port: {text!r} (a whole number from {PORT_MIN} to {PORT_MAX})"
        )
    return port


def open_database(url: str, where: str, *, migrate: bool = True) -> Engine:
    """An engine for `url` that has connected (and, with `migrate`, brought the schema to
    the newest revision); `where` names the setting to fix in the failure's line.

    Raises:
        StartupFailure: (exit code 15) the database cannot be reached, opened or migrated,
            the URL is malformed, or its driver is not installed.
    """
    import sqlalchemy as sa

    from rbroker_server.db import engine as db
    from rbroker_server.startup import database_failure

    engine = None
    try:
        engine = db.make_engine(url)
        if migrate:
            db.upgrade(engine)
        else:
            with engine.connect():
                pass
    except (sa.exc.SQLAlchemyError, ModuleNotFoundError) as exc:
        if engine is not None:
            engine.dispose()
        if isinstance(exc, ModuleNotFoundError):
            exc = sa.exc.ArgumentError(
                f"its driver ({exc.name}) is not installed; PostgreSQL takes "
                "postgresql+psycopg://user@host:5432/dbname"
            )
        raise database_failure(url, exc, where) from None
    return engine


def _where(args: argparse.Namespace) -> str:
    return f"database_url in {Path(args.data_dir) / CONFIG_NAME}"


def _engine(args: argparse.Namespace) -> Engine:
    settings = _load(args)
    args.db_url, args.db_where = settings.db_url, _where(args)
    return open_database(settings.db_url, _where(args))


# ---------------------------------------------------------------- setup


LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def default_public_hostname(bind: str) -> str:
    """`localhost` only when binding a loopback address (nothing else can reach it then);
    otherwise this machine's fully qualified name (`socket.getfqdn()`, else its host name),
    since other computers must reach the coordinator by that name."""
    if bind in LOOPBACK or bind.startswith("127."):
        return "localhost"
    import socket

    for name in (socket.getfqdn(), socket.gethostname()):
        if name and name != "localhost" and not name.startswith("localhost."):
            return name
    return "localhost"


def _ask(prompt: str, default: str, interactive: bool) -> str:
    if not interactive:
        return default
    try:
        answer = input(f"{prompt} [{default}]: ").strip()
    except EOFError as exc:
        raise CliError("input ended; pass --non-interactive and the values as flags") from exc
    return answer or default


def cmd_setup(args: argparse.Namespace) -> int:
    import sqlalchemy as sa

    from rbroker_server.admin import operations as admin
    from rbroker_server.db import engine as db
    from rbroker_server.edge import tls

    interactive = not args.non_interactive and sys.stdin.isatty()
    data_dir = Path(_ask("Data directory", str(args.data_dir), interactive)).resolve()
    if (data_dir / CONFIG_NAME).exists() and not args.force:
        raise CliError(
            f"{data_dir / CONFIG_NAME} exists already; pass --force to rewrite it "
            "(the database, groups and tokens are kept)"
        )
    bind = _ask("Bind address (0.0.0.0: all)", args.bind, interactive)
    hostname = _ask(
        "Public hostname (the name computers use to reach it)",
        args.public_hostname or default_public_hostname(bind),
        interactive,
    )
    try:
        port = port_number(_ask("Port", str(args.port), interactive))
    except argparse.ArgumentTypeError as exc:
        raise CliError(str(exc)) from None
    database_url = _ask(
        "Database URL (empty: SQLite in the data dir)", args.database_url or "", interactive
    )
    self_signed = args.self_signed
    cert, key = args.tls_cert or "", args.tls_key or ""
    if interactive and not (self_signed or cert):
        choice = _ask("TLS: (s)elf-signed, (f)iles, (n)one", "s", interactive).lower()
        self_signed = choice.startswith("s")
        if choice.startswith("f"):
            cert = _ask("TLS certificate (PEM)", "", interactive)
            key = _ask("TLS private key (PEM)", "", interactive)
    if bool(cert) != bool(key):
        raise CliError("--tls-cert and --tls-key go together")
    for path in (cert, key):
        if path and not Path(path).is_file():
            raise CliError(f"TLS file not found: {path}")
    group_name = _ask("First group", args.group, interactive)

    private_dir(data_dir)
    where = "--database-url" if database_url else f"that {data_dir} is writable"
    args.db_url, args.db_where = database_url, where
    if database_url:  # reached before anything is written: a failure leaves no config behind
        try:
            created = db.ensure_database(database_url)
        except (sa.exc.SQLAlchemyError, ModuleNotFoundError):
            created = False  # open_database below names the fault
        open_database(database_url, where, migrate=False).dispose()
        if created:
            print(f"database created: {_redact_url(database_url)}")
    ca = ""
    if self_signed:
        files = tls.generate_self_signed(data_dir / "tls", hostname, args.san or [])
        cert, key, ca = str(files.cert), str(files.key), str(files.ca_cert)
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        public_hostname=hostname,
        bind_host=bind,
        bind_port=port,
        tls_cert=str(Path(cert).resolve()) if cert else "",
        tls_key=str(Path(key).resolve()) if key else "",
        tls_ca=ca,
        external_url=args.external_url or "",
        trusted_proxies=tuple(args.trusted_proxy or ()),
        trusted_proxy_secret=args.trusted_proxy_secret or "",
    )
    engine = open_database(settings.db_url, where)
    try:
        config = settings.save()
        if group_name not in {g.name for g in admin.list_groups(engine)}:
            admin.create_group(engine, group_name)
        token = admin.create_token(engine, group_name, name="setup")
        code = admin.create_enroll_code(engine, group_name, settings.enroll_code_ttl_s)
    finally:
        engine.dispose()
    url = settings.base_url
    print(f"config written:   {config}")
    print(f"database:         {_redact_url(settings.db_url)}")
    if ca:
        print(f"TLS CA (copy to computers): {ca}")
    print(f"coordinator URL:  {url}")
    print(f"group:            {group_name}")
    print("Shown once, keep them safe:")
    print(f"viewer token:     {token.text}")
    print(f"enrollment code:  {code.text}  (one use, expires {_fmt_time(code.expires_at)})")
    print(f"next: rbroker-server serve --data-dir {data_dir}")
    ca_hint = f" --ca-file {ca}" if ca and not settings.external_url else ""
    print(f"on a computer: rbroker enroll {url} {code.text}{ca_hint}")
    return 0


def _redact_url(url: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


# ---------------------------------------------------------------- serve


def quiet_migrations(log_level: str) -> None:
    """Alembic logs its plugin setup and migration context at INFO on every start (eight
    lines before the first request): keep it to warnings unless `--log-level debug`."""
    if log_level.lower() != "debug":
        logging.getLogger("alembic").setLevel(logging.WARNING)


def cmd_serve(args: argparse.Namespace) -> int:
    from rbroker_server.startup import check_database, prepare, raise_fd_limit, run

    settings = _load(args)
    private_dir(settings.data_dir)  # 0700 (or 0750 for a service group) whatever the umask
    quiet_migrations(args.log_level)
    host = args.host or settings.bind_host
    port = args.port or settings.bind_port
    ssl: dict[str, str] = {}
    if settings.tls_enabled:
        ssl = {"ssl_certfile": settings.tls_cert, "ssl_keyfile": settings.tls_key}
    trusted = list(settings.trusted_proxies)
    # database, TLS files and address checked before logging starts, so that a failure to
    # start is one line with its exit code (rbroker_server.startup), never a traceback
    revision = check_database(settings)
    # the web application (Litestar, about 1 s of imports) only once the configuration and
    # the database are known good: a coordinator that cannot start says so at once
    from rbroker_server.app import create_app
    from rbroker_server.edge.net import parse_networks
    from rbroker_server.edge.slow_clients import ConnectionGuard, default_protocol, guarded_protocol

    guard = ConnectionGuard(
        head_timeout_s=settings.head_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        max_total=settings.max_connections,
        max_per_address=settings.max_connections_per_address,
        exempt=parse_networks(trusted),
    )
    config, sock = prepare(
        create_app(settings, migrate=False),
        host=host,
        port=port,
        log_level=args.log_level,
        # access logs name the client behind the configured proxies only (the same rule
        # as rbroker_server.edge.net.client_address); no proxy configured: the peer itself
        proxy_headers=bool(trusted),
        forwarded_allow_ips=trusted or None,
        server_header=False,
        # deadlines for a request's head and body, caps on open connections per address
        # and in all (uvicorn has neither; rbroker_server.edge.slow_clients)
        http=guarded_protocol(default_protocol(), guard),
        **ssl,
    )
    # --log-level is uvicorn's (its access lines are INFO); the coordinator's own lines are
    # INFO, or finer with a finer --log-level
    wanted = logging.getLevelName(args.log_level.upper())
    logging.basicConfig(
        level=min(logging.INFO, wanted) if isinstance(wanted, int) else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger(__name__).info("database schema at revision %s", revision)
    limits = raise_fd_limit()
    if limits is not None:
        logging.getLogger(__name__).info(
            "open files: soft limit %d (was %d), one per connection", limits[1], limits[0]
        )
        # keep room for the database, log files and accepting: past the cap a connection
        # is refused with a 503 instead of failing to be accepted at all
        room = max(64, limits[1] - 128)
        if limits[1] > 0 and guard.max_total > room:
            guard.max_total = room
            logging.getLogger(__name__).warning(
                "max_connections lowered to %d: the open-files limit is %d", room, limits[1]
            )
    run(config, sock)
    return 0


# ---------------------------------------------------------------- admin


def cmd_group(args: argparse.Namespace) -> int:
    from rbroker_server.admin import operations as admin

    engine = _engine(args)
    try:
        if args.action == "create":
            group = admin.create_group(engine, args.name)
            print(f"group {group.name} created")
        else:
            for g in admin.list_groups(engine):
                print(f"{g.name}\tcomputers={g.computers}\ttokens={g.tokens}")
    finally:
        engine.dispose()
    return 0


def cmd_enroll_code(args: argparse.Namespace) -> int:
    from rbroker_server.admin import operations as admin

    engine = _engine(args)
    try:
        if args.action == "list":
            codes = admin.list_enroll_codes(engine, args.group, include_done=args.all)
            if not codes:
                print(f"no {'' if args.all else 'unused '}enrollment codes in group {args.group}")
            for c in codes:
                done = (
                    f"used {_fmt_time(c.used_at)} by {c.computer_id}"
                    if c.state == "used"
                    else f"expires {_fmt_time(c.expires_at)}"
                    if c.state == "unused"
                    else f"expired {_fmt_time(c.expires_at)}"
                )
                print(f"{c.id}\t{c.state}\tcreated {_fmt_time(c.created_at)}\t{done}")
            return 0
        if args.action == "revoke":
            if not admin.revoke_enroll_code(engine, args.group, args.code):
                raise CliError(f"no enrollment code {args.code} in group {args.group}")
            code_id = args.code.split("_")[1] if "_" in args.code else args.code
            print(f"enrollment code {code_id} revoked")
            return 0
        ttl = args.ttl if args.ttl is not None else _load(args).enroll_code_ttl_s
        code = admin.create_enroll_code(engine, args.group, ttl)
    finally:
        engine.dispose()
    print(code.text)
    print(f"one use, group {code.group}, expires {_fmt_time(code.expires_at)}", file=sys.stderr)
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    from rbroker_server.admin import operations as admin

    engine = _engine(args)
    try:
        if args.action == "create":
            token = admin.create_token(engine, args.group, args.name or "")
            print(token.text)
            print(f"viewer token {token.id} for group {token.group} (shown once)", file=sys.stderr)
        elif args.action == "revoke":
            if not admin.revoke_token(engine, args.group, args.token):
                raise CliError(f"no token {args.token} in group {args.group}")
            print(f"token {args.token.split('_')[1] if '_' in args.token else args.token} revoked")
        else:
            for t in admin.list_tokens(engine, args.group):
                state = "revoked" if t.revoked else "active"
                print(f"{t.id}\t{state}\t{_fmt_time(t.created_at)}\t{t.name}")
    finally:
        engine.dispose()
    return 0


def cmd_computer(args: argparse.Namespace) -> int:
    from rbroker_server.admin import operations as admin

    engine = _engine(args)
    try:
        if args.action == "revoke":
            if not admin.revoke_computer(engine, args.computer_id):
                raise CliError(f"no computer {args.computer_id}")
            print(f"computer {args.computer_id} revoked")
        else:
            for c in admin.list_computers(engine, args.group):
                marks = ",".join(
                    m for m, on in (("revoked", c.revoked), ("flagged", c.flagged)) if on
                )
                print(
                    f"{c.id}\t{c.group}\t{c.name}\tlast seen {_fmt_time(c.last_seen_at)}"
                    f"\t{marks or 'ok'}"
                )
    finally:
        engine.dispose()
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from rbroker_server.db import engine as db

    engine = _engine(args)  # upgraded
    try:
        print(f"database at revision {db.head_revision()}")
    finally:
        engine.dispose()
    return 0


# ---------------------------------------------------------------- parser


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
    from rbroker_server.startup import StartupFailure

    try:
        return int(args.func(args))
    except StartupFailure as exc:
        print(f"rbroker-server: {exc.line}", file=sys.stderr)
        return exc.code
    except (CliError, AdminError, ValueError) as exc:
        print(f"rbroker-server: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_FAILED
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

    from rbroker_server.startup import database_failure

    if not isinstance(exc, sa.exc.SQLAlchemyError):
        return None
    url = getattr(args, "db_url", "") or "(configured)"
    return database_failure(url, exc, getattr(args, "db_where", "database_url in config.toml"))


if __name__ == "__main__":
    sys.exit(main())

"""What the `rbroker-server` commands share: the one-line failure (`CliError`), the
configuration and the database a command opens, the argument types and the time format."""

from __future__ import annotations

import argparse
import re
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from rbroker_server.settings import CONFIG_NAME, PORT_MAX, PORT_MIN, Settings

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


class CliError(Exception):
    """A failure to report as one line on stderr; `code` the exit code (1: it failed, 2: bad
    input, the command given what it cannot take)."""

    def __init__(self, text: str, code: int = 1) -> None:
        super().__init__(text)
        self.code = code


def parse_duration(text: str) -> float:
    """`90`, `90s`, `30m`, `24h`, `7d` → seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 30m, 24h, 7d)")
    unit = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    return float(m.group(1)) * unit


def fmt_time(value: datetime | None) -> str:
    """A time as the commands print it (`2026-12-01 09:30:00 UTC`; `-` for none)."""
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "-"


def load_settings(args: argparse.Namespace) -> Settings:
    """The settings in `--data-dir`'s `config.toml` (a `CliError` naming the fix when there
    is none)."""
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

    from rbroker_server.cli.startup import database_failure
    from rbroker_server.db import engine as db

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


def database_where(args: argparse.Namespace) -> str:
    """Where the database is configured, for a failure's line."""
    return f"database_url in {Path(args.data_dir) / CONFIG_NAME}"


def configured_engine(args: argparse.Namespace) -> Engine:
    """The configured database, opened and upgraded (`open_database`); what a later fault's
    line names is kept on `args`."""
    settings = load_settings(args)
    args.db_url, args.db_where = settings.db_url, database_where(args)
    return open_database(settings.db_url, database_where(args))

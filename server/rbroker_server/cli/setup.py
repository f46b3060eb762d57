"""`rbroker-server setup`: writes `config.toml` in the data dir, creates the database (SQLite
there, or the PostgreSQL one `--database-url` names), the first group, a viewer token and an
enrollment code, and with `--self-signed` a CA and a server certificate."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from rbroker_protocol.files import private_dir
from rbroker_server.cli.common import CliError, fmt_time, open_database, port_number
from rbroker_server.settings import CONFIG_NAME, Settings

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
    print(f"enrollment code:  {code.text}  (one use, expires {fmt_time(code.expires_at)})")
    print(f"next: rbroker-server serve --data-dir {data_dir}")
    ca_hint = f" --ca-file {ca}" if ca and not settings.external_url else ""
    print(f"on a computer: rbroker enroll {url} {code.text}{ca_hint}")
    return 0


def _redact_url(url: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)

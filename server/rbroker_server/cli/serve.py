"""`rbroker-server serve`: the coordinator on the configured address (HTTPS when configured),
its database, TLS files and address checked first (`startup`), slow and greedy clients held
off below the app (`rbroker_server.edge.slow_clients`)."""

from __future__ import annotations

import argparse
import logging

from rbroker_protocol.files import private_dir
from rbroker_server.cli.common import load_settings

log = logging.getLogger(__package__)
"""The command's own lines go out under the `rbroker_server.cli` logger."""


def quiet_migrations(log_level: str) -> None:
    """Alembic logs its plugin setup and migration context at INFO on every start (eight
    lines before the first request): keep it to warnings unless `--log-level debug`."""
    if log_level.lower() != "debug":
        logging.getLogger("alembic").setLevel(logging.WARNING)


def cmd_serve(args: argparse.Namespace) -> int:
    from rbroker_server.cli.startup import check_database, prepare, raise_fd_limit, run

    settings = load_settings(args)
    private_dir(settings.data_dir)  # 0700 (or 0750 for a service group) whatever the umask
    quiet_migrations(args.log_level)
    host = args.host or settings.bind_host
    port = args.port or settings.bind_port
    ssl: dict[str, str] = {}
    if settings.tls_enabled:
        ssl = {"ssl_certfile": settings.tls_cert, "ssl_keyfile": settings.tls_key}
    trusted = list(settings.trusted_proxies)
    # database, TLS files and address checked before logging starts, so that a failure to
    # start is one line with its exit code (rbroker_server.cli.startup), never a traceback
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
    log.info("database schema at revision %s", revision)
    limits = raise_fd_limit()
    if limits is not None:
        log.info("open files: soft limit %d (was %d), one per connection", limits[1], limits[0])
        # keep room for the database, log files and accepting: past the cap a connection
        # is refused with a 503 instead of failing to be accepted at all
        room = max(64, limits[1] - 128)
        if limits[1] > 0 and guard.max_total > room:
            guard.max_total = room
            log.warning(
                "max_connections lowered to %d: the open-files limit is %d", room, limits[1]
            )
    run(config, sock)
    return 0

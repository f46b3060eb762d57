"""`rbroker-server db upgrade`: bring the database schema to the newest revision."""

from __future__ import annotations

import argparse

from rbroker_server.cli.common import configured_engine


def cmd_db(args: argparse.Namespace) -> int:
    from rbroker_server.db import engine as db

    engine = configured_engine(args)  # upgraded
    try:
        print(f"database at revision {db.head_revision()}")
    finally:
        engine.dispose()
    return 0

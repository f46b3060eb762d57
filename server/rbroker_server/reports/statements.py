"""Prebuilt Core statements of the report hot path.

Building a statement costs more than running it; these are built once (per variant and
dialect) with bind parameters, so each report only binds values. The writes that a batch
shares (`prepared`) are also compiled once per database dialect and run on the driver's
cursor: SQLAlchemy's work per execution (its execution context, parameter building)
cost the writer thread more than the database did.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect

from rbroker_server.db.tables import COMPUTERS, HISTORY, RUNS, USAGE

STATE_COLUMNS = (
    "seq",
    "last_seen_at",
    "generated_at",
    "clock_skew_s",
    "reported_name",
    "broker_version",
    "telemetry_source",
    "state",
)
"""Columns every applied report sets (bound as `v_<column>`)."""

SELECT_COMPUTER = sa.select(
    COMPUTERS.c.public_key,
    COMPUTERS.c.revoked_at,
    COMPUTERS.c.run_id,
    COMPUTERS.c.run_counter,
    COMPUTERS.c.seq,
    COMPUTERS.c.history_at,
    COMPUTERS.c.generated_at,
    COMPUTERS.c.last_seen_at,
).where(COMPUTERS.c.id == sa.bindparam("w_id"))
"""What the hot path needs to know about the sender (bind `w_id`)."""

SELECT_COMPUTERS = sa.select(COMPUTERS.c.id, *SELECT_COMPUTER.selected_columns).where(
    COMPUTERS.c.id.in_(sa.bindparam("w_ids", expanding=True))
)
"""`SELECT_COMPUTER` for several senders at once, with their ids (bind `w_ids`, a list)."""

SELECT_RUN = sa.select(COMPUTERS.c.run_id).where(COMPUTERS.c.id == sa.bindparam("w_id"))
"""The sender's current run (bind `w_id`): read where a new run's row exists already."""


def _bind(column: str) -> sa.BindParameter[Any]:
    return sa.bindparam(f"v_{column}", type_=COMPUTERS.c[column].type)


@functools.cache
def update_computer(
    *,
    same_run: bool,
    old_run_null: bool,
    flagged: bool,
    new_bucket: bool,
    by_time: bool = False,
    since: bool = False,
) -> Any:
    """The conditional UPDATE that applies a report, for one combination of cases.

    Applies only while the computer is not revoked and its key is still `w_key` (the key
    the report's signature held for), so a revocation or a new key written by another
    coordinator process takes effect even where this one still has the row cached.

    Binds: `w_id`, `w_key`; same run: `w_run`, `w_seq` (applies only if `seq < w_seq`); new run:
    `w_old_run` unless `old_run_null`, `v_run_id` and `v_run_counter`; `v_<column>` for
    `STATE_COLUMNS`; `v_flagged_at`, `v_flags` when flagged; `v_history_at` for a new
    history bucket. `by_time` (a new run that run counters do not order): applies only
    while the current run's latest report was generated no later than `v_generated_at`.
    `since` (a report that adds usage since the previous one): applies only while the
    previous applied report is the one received at `w_last_seen`, so no interval is counted
    twice when another write came first.
    """
    where = sa.and_(
        COMPUTERS.c.id == sa.bindparam("w_id"),
        COMPUTERS.c.revoked_at.is_(None),
        COMPUTERS.c.public_key == sa.bindparam("w_key"),
    )
    values: dict[str, Any] = {c: _bind(c) for c in STATE_COLUMNS}
    values["reports_applied"] = COMPUTERS.c.reports_applied + 1
    if same_run:
        where = sa.and_(
            where,
            COMPUTERS.c.run_id == sa.bindparam("w_run"),
            COMPUTERS.c.seq < sa.bindparam("w_seq", type_=sa.BigInteger()),
        )
    else:
        old = (
            COMPUTERS.c.run_id.is_(None)
            if old_run_null
            else COMPUTERS.c.run_id == sa.bindparam("w_old_run")
        )
        where = sa.and_(where, old)
        if by_time:
            where = sa.and_(
                where,
                sa.or_(
                    COMPUTERS.c.generated_at.is_(None),
                    COMPUTERS.c.generated_at <= _bind("generated_at"),
                ),
            )
        values["run_id"] = _bind("run_id")
        values["run_counter"] = _bind("run_counter")
    if since:
        last_seen = sa.bindparam("w_last_seen", type_=COMPUTERS.c.last_seen_at.type)
        where = sa.and_(where, COMPUTERS.c.last_seen_at == last_seen)
    if flagged:
        values.update(flagged=sa.true(), flagged_at=_bind("flagged_at"), flags=_bind("flags"))
    if new_bucket:
        values["history_at"] = _bind("history_at")
    return sa.update(COMPUTERS).where(where).values(**values)


def _insert(dialect: str, table: sa.Table) -> Any:
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


@functools.cache
def insert_run(dialect: str) -> Any:
    """Record a run; returns a row only when it was new (binds the column names)."""
    return _insert(dialect, RUNS).on_conflict_do_nothing().returning(RUNS.c.run_id)


@functools.cache
def insert_history(dialect: str) -> Any:
    """Add a history point unless another coordinator wrote that bucket already."""
    return _insert(dialect, HISTORY).on_conflict_do_nothing()


@functools.cache
def add_usage(dialect: str) -> Any:
    """Add a report's `daily_usage` increments (`usage.rollup.usage_rows`) to the rows of
    their day, computer, project and owner, inserting the rows that do not exist yet."""
    insert = _insert(dialect, USAGE)
    return insert.on_conflict_do_update(
        index_elements=[USAGE.c.computer_id, USAGE.c.day, USAGE.c.project, USAGE.c.owner],
        set_={
            "granted_mib_hours": USAGE.c.granted_mib_hours + insert.excluded.granted_mib_hours,
            "used_mib_hours": USAGE.c.used_mib_hours + insert.excluded.used_mib_hours,
        },
    )


class Prepared:
    """A statement compiled once for one dialect and run with the driver's `executemany`,
    binding values through the same type processors as SQLAlchemy (UTC times, JSON).

    Args:
        statement: a Core statement whose binds are named (`bindparam`) or literal.
        dialect: the engine's dialect (its JSON serializer included).
        column_keys: an INSERT's columns (bound by their names); None for other statements.
    """

    def __init__(
        self, statement: Any, dialect: Dialect, column_keys: Sequence[str] | None = None
    ) -> None:
        compiled: Any = statement.compile(
            dialect=dialect, column_keys=list(column_keys) if column_keys else None
        )
        self.sql: str = compiled.string
        processors: dict[str, Callable[[Any], Any]] = compiled._bind_processors
        self.literals: dict[str, Any] = {
            name: bind.effective_value
            for bind, name in compiled.bind_names.items()
            if not bind.required
        }
        self.positional: bool = compiled.positiontup is not None
        names: list[str] = (
            list(compiled.positiontup) if self.positional else list(compiled.bind_names.values())
        )
        self.names = tuple(names)
        self.processors = tuple(processors.get(n) for n in names)

    def bound(self, params: dict[str, Any]) -> tuple[Any, ...] | dict[str, Any]:
        """`params` (bind name → value; literal binds may be left out) as the driver takes
        them: a tuple in the statement's order (positional paramstyles) or a dict.

        Raises:
            KeyError: a bind without a value.
        """
        values = []
        for name, process in zip(self.names, self.processors, strict=True):
            value = params[name] if name in params else self.literals[name]
            values.append(value if process is None or value is None else process(value))
        return tuple(values) if self.positional else dict(zip(self.names, values, strict=True))

    def executemany(self, conn: Connection, params: Sequence[dict[str, Any]]) -> int:
        """Run the statement once per element of `params` in `conn`'s transaction; the rows
        it changed in all.

        Raises:
            KeyError: a bind without a value; sqlalchemy.exc.DBAPIError: the database
            refused a statement.
        """
        rows: Any = [self.bound(p) for p in params]
        driver_error = conn.dialect.loaded_dbapi.Error
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.executemany(self.sql, rows)
            return int(cursor.rowcount)
        except driver_error as exc:  # as SQLAlchemy would raise it (a database fault)
            raise sa.exc.DBAPIError.instance(self.sql, None, exc, driver_error) from exc
        finally:
            cursor.close()


_PREPARED: weakref.WeakKeyDictionary[Dialect, dict[Any, Prepared]] = weakref.WeakKeyDictionary()


def prepared(
    conn: Connection, statement: Any, column_keys: Sequence[str] | None = None
) -> Prepared:
    """`statement` compiled for `conn`'s dialect (once per statement, columns and dialect;
    `statement` is one of this module's cached statements)."""
    by_dialect = _PREPARED.setdefault(conn.dialect, {})
    key = (id(statement), tuple(column_keys or ()))
    found = by_dialect.get(key)
    if found is None:
        found = by_dialect[key] = Prepared(statement, conn.dialect, column_keys)
    return found


HISTORY_KEYS = ("computer_id", "at", "data")
"""The columns `insert_history` binds."""

USAGE_KEYS = ("computer_id", "day", "project", "owner", "granted_mib_hours", "used_mib_hours")
"""The columns `add_usage` binds (`usage.rollup.usage_rows`' keys)."""

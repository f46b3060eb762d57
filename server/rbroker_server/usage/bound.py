"""How many `daily_usage` rows one computer adds per day: at most `usage_names_per_day`
pairs of project and owner per computer and UTC day (architecture.md §7).

A report names its leases' projects and owners freely (up to 4 096 leases a report), so
without a bound one enrolled computer that renames its projects at every report adds rows
without end (about 340 000 rows in 45 s were measured, and its group's usage page then took
16 s). Past the bound, a pair the computer has no row for on that day is added to the
`(other)` row (`rbroker_protocol.usage.OTHER_NAME` as project and owner) of that computer
and day: its usage still counts, under no name. Pairs that have a row go on adding to it.
So a computer has at most `usage_names_per_day` + 1 rows a day, and a group at most that
many times its computers times `usage_window_days`.

`UsageNames` knows each computer's pairs of a day as the writer thread last wrote them,
reading them from the table on a miss (one indexed read of the primary key's prefix). It
is used by one writer thread only (no lock). A pair counted for a write that was then
rolled back makes the bound stricter by one, never looser. Several coordinator processes
on one database each apply the bound to what they know: a computer whose reports are
spread over N processes may get up to N times the bound (the operator guide's advice is one
process, or a proxy that keeps a computer on one).
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import date
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from rbroker_protocol.usage import OTHER_NAME
from rbroker_server.db.tables import USAGE

MAX_PAIRS_KEPT: Final = 500_000
"""Pairs `UsageNames` keeps in memory at most, over all computers and days (≈ 150 B each,
75 MB at most); past it the computers written least recently are forgotten (read again
from the table when they next report)."""

_FIGURES: Final = ("granted_mib_hours", "used_mib_hours")

Pair = tuple[str, str]
"""(project, owner) as stored."""

_OTHER: Final[Pair] = (OTHER_NAME, OTHER_NAME)


class UsageNames:
    """The pairs each computer has `daily_usage` rows for on a day (see the module's
    docstring).

    Args:
        per_day: pairs a computer may have rows for on one day, `(other)` not counted
            (`Settings.usage_names_per_day`).
        max_pairs_kept: `MAX_PAIRS_KEPT`.
    """

    def __init__(self, per_day: int, max_pairs_kept: int = MAX_PAIRS_KEPT) -> None:
        self.per_day = per_day
        self.max_pairs_kept = max_pairs_kept
        self._known: OrderedDict[tuple[str, date], set[Pair]] = OrderedDict()
        self._kept = 0

    def bounded(self, conn: Connection, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`rows` (`usage.rollup.usage_rows` of one or more writes) with every row whose
        pair is past its computer's bound for that day moved to the `(other)` pair, rows of
        the same computer, day and pair merged (one upsert may not touch a row twice), in
        the order they came.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the read of a computer's pairs failed.
        """
        out: dict[tuple[str, date, str, str], dict[str, Any]] = {}
        for row in rows:
            pair: Pair = (row["project"], row["owner"])
            known = self._pairs(conn, row["computer_id"], row["day"])
            if pair not in known:
                named = len(known) - (_OTHER in known)
                if pair != _OTHER and named >= self.per_day:
                    pair = _OTHER
                if pair not in known:
                    known.add(pair)
                    self._kept += 1
            key = (row["computer_id"], row["day"], *pair)
            if key in out:
                merged = out[key]
                for figure in _FIGURES:
                    merged[figure] = merged[figure] + row[figure]
            else:
                out[key] = {**row, "project": pair[0], "owner": pair[1]}
        self._trim()
        return list(out.values())

    def _pairs(self, conn: Connection, computer_id: str, day: date) -> set[Pair]:
        key = (computer_id, day)
        known = self._known.get(key)
        if known is None:
            statement = sa.select(USAGE.c.project, USAGE.c.owner).where(
                USAGE.c.computer_id == computer_id, USAGE.c.day == day
            )
            known = {(r.project, r.owner) for r in conn.execute(statement)}
            self._known[key] = known
            self._kept += len(known)
        else:
            self._known.move_to_end(key)
        return known

    def _trim(self) -> None:
        while self._kept > self.max_pairs_kept and len(self._known) > 1:
            _, dropped = self._known.popitem(last=False)
            self._kept -= len(dropped)

    def __len__(self) -> int:
        """Pairs kept in memory."""
        return self._kept

"""The usage CSV (`rbroker_server.usage.service.to_csv`) as spreadsheets read it: no name
becomes a formula, whichever separator the reader splits on, and every name comes back whole.
A pure function: the HTTP answer that carries it is tests/server/test_usage.py's."""

from __future__ import annotations

import csv
import io
from datetime import date

import pytest

from rbroker_protocol.usage import UsageDay, UsageView
from rbroker_server.usage.service import FORMULA_STARTS, csv_cell, to_csv

HOSTILE = [
    "x;=1+1;x",
    "x,=1+1,x",
    "x\t=1+1\tx",
    "x|=1+1|x",
    '=HYPERLINK("http://evil.example","x")',
    'a";=1+1;"b',
    "+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(A1)",
    "line\r\n=1+1",
    "vision",
]


def _view(names: list[str]) -> UsageView:
    day = date(2026, 12, 1)
    rows = [UsageDay(day=day, name=n, granted_mib_hours=1.5, used_mib_hours=0.5) for n in names]
    return UsageView(group="lab", by="project", days=1, since=day, until=day, usage=rows, totals=[])


@pytest.mark.parametrize("separator", [",", ";", "\t", "|"])
def test_no_separator_splits_a_formula_out_of_a_name(separator: str) -> None:
    text = to_csv(_view(HOSTILE))
    rows = list(csv.reader(io.StringIO(text, newline=""), delimiter=separator))
    # a reader may also trim spaces and a quote around what it cut
    cells = [cell.strip().strip('"').strip() for row in rows for cell in row]
    assert [c for c in cells if c.startswith(FORMULA_STARTS)] == []
    if separator == ",":  # the CSV's own separator: each name whole, formulas behind a '
        names = [row[1] for row in rows[1:]]
        assert [n.replace("'", "") for n in names] == [n.replace("'", "") for n in HOSTILE]
        assert names[-1] == "vision"


@pytest.mark.parametrize(
    ("name", "cell"),
    [
        ("vision", "vision"),
        ("nlp-team", "nlp-team"),
        ("a@b", "a@b"),
        ("=1+1", "'=1+1"),
        ("x;=1+1;x", "x;'=1+1;x"),
        ("x; =1+1", "x; '=1+1"),
        ('x"=1', "x\"'=1"),
        ("team - vision", "team '- vision"),
    ],
)
def test_a_formula_start_after_a_split_gets_a_quote_mark_and_nothing_else_changes(
    name: str, cell: str
) -> None:
    assert csv_cell(name) == cell

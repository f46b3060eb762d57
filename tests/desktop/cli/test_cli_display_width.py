"""Tables are laid out in terminal cells, not characters (rbroker.cli.sheet): a CJK or
full-width name takes two cells a character and a combining mark none, so the columns after
such a name stay in line, in plain output (`rbroker top --once | cat`) and in a terminal.
Pure rendering, no broker."""

from __future__ import annotations

import io

import pytest
from rich.cells import cell_len
from rich.console import Console

from rbroker.cli.sheet import Cell, Column, Sheet

NAMES = ["vision", "视觉研究组", "ｖｉｓｉｏｎ", "e\u0301quipe", "ﾊﾝｶｸ", "mixed 中文 text"]


def _sheet() -> Sheet:
    sheet = Sheet(
        "leases",
        [Column("project"), Column("MiB", justify="right"), Column("purpose", free_text=True)],
    )
    for n, name in enumerate(NAMES):
        sheet.add(Cell(name), Cell(f"{(n + 1) * 1024:,}".replace(",", " ")), Cell("训练 " * n))
    return sheet


def _end_of(line: str, text: str) -> int:
    """The terminal cell just after `text` in `line`."""
    return cell_len(line[: line.index(text) + len(text)])


def test_plain_columns_line_up_in_cells_after_wide_names() -> None:
    lines = _sheet().plain().splitlines()[2:]  # after the title and the header
    assert len(lines) == len(NAMES)
    # the right-aligned MiB column ends in the same cell on every row
    ends = {_end_of(line, f"{(n + 1) * 1024:,}".replace(",", " ")) for n, line in enumerate(lines)}
    assert len(ends) == 1, lines
    header = _sheet().plain().splitlines()[1]
    assert ends == {_end_of(header, "MiB")}


@pytest.mark.parametrize("width", [40, 80, 120])
def test_a_terminal_table_lines_up_and_fits_with_wide_names(width: int) -> None:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, legacy_windows=False)
    console.print(_sheet())
    lines = out.getvalue().splitlines()
    assert all(cell_len(line) <= width for line in lines), lines
    ends = {
        _end_of(line, f"{(n + 1) * 1024:,}".replace(",", " "))
        for n in range(len(NAMES))
        for line in lines
        if line.startswith(NAMES[n])
    }
    assert len(ends) == 1, out.getvalue()


def test_the_jobs_table_says_when_finished_jobs_were_dropped() -> None:
    """`jobs.list`'s `finished_dropped` is a line under `rbroker jobs`' table (plain and in a
    terminal); none when nothing was dropped or the broker does not say."""
    from rbroker.cli.views import finished_note, jobs_table

    assert finished_note({"jobs": []}) is None
    assert finished_note({"jobs": [], "finished_kept_per_user": 100, "finished_dropped": 0}) is None
    note = finished_note({"jobs": [], "finished_kept_per_user": 100, "finished_dropped": 2500})
    assert note == "finished jobs: the newest 100 of each user are kept; 2 500 older ones dropped"
    assert finished_note({"jobs": [], "others_left_out": 1500}) == (
        "1 500 older jobs of other users not listed"
    )
    job = {
        "job_id": "job-000000000001",
        "owner": "alice",
        "project": "p",
        "purpose": "embed",
        "handler": "h",
        "state": "running",
        "reason": "",
        "total_items": 10,
        "completed_items": 1,
        "failed_items": 0,
        "workers": 1,
        "lease_ids": [],
        "items_per_s": None,
        "eta_s": None,
    }
    assert jobs_table([job], note).plain().splitlines()[-1] == note
    out = io.StringIO()
    Console(file=out, width=100, color_system=None).print(jobs_table([job], note))
    assert out.getvalue().splitlines()[-1] == note

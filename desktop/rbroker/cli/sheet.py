"""Tables that fit the terminal they are printed in, and plain rows when they are not.

A `Sheet` holds a table's content independent of width. Rendered in a terminal it picks a
layout for the width it is given: numbers and headers are never wrapped or cut (each such
column is exactly as wide as its widest cell), long identifiers switch to their short form,
optional columns drop out from the right, and only free text (owner, project, purpose, a
queue's reason…) is narrowed to what is left, where it wraps within its column (at spaces,
a word longer than the column folds); a terminal narrower than the numbers and headers that
remain gets each row as a wrapped record instead (`records`): nothing is ever cut, so the
arithmetic that explains a wait is whole at any width. `plain()` is for pipes and files:
every row on one line, columns aligned and separated by at least two spaces, no colour, no
bars.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

GAP = 2
"""Spaces between two columns (the table's padding of one on each side)."""


@dataclass(frozen=True)
class Cell:
    """One cell: `text` in a terminal, `short` (optional) where the width is tight, `plain`
    (default: `text`'s characters) in plain output. `bar(width) -> Text` makes the cell a bar
    that takes the room left over (between the column's `bar_min` and `bar_max` cells)."""

    text: str | Text = ""
    short: str | Text | None = None
    plain: str | None = None
    bar: Callable[[int], Text] | None = None

    def shown(self, short: bool) -> str | Text:
        """What a terminal shows: `short` where asked for and given, else `text`."""
        return self.short if short and self.short is not None else self.text

    def plain_text(self) -> str:
        """The untruncated plain form."""
        if self.plain is not None:
            return self.plain
        return self.text.plain if isinstance(self.text, Text) else self.text


@dataclass(frozen=True)
class Column:
    """A column. `free_text` columns may be narrowed (down to `min_free` characters), where
    their text wraps within the column instead of being cut;
    `optional` columns are dropped, from the right, when the width is too small; an `is_bar`
    column draws `Cell.bar` between `bar_min` and `bar_max` cells wide; `plain=False` leaves
    the column out of plain output."""

    header: str
    justify: Literal["left", "right"] = "left"
    free_text: bool = False
    optional: bool = False
    min_free: int = 8
    bar_min: int = 8
    bar_max: int = 30
    plain: bool = True
    is_bar: bool = False


def bar_column(header: str, bar_min: int = 8, bar_max: int = 30) -> Column:
    """A column of capacity or progress bars (cells with `Cell.bar`); not in plain output
    unless its cells carry a `plain` form."""
    return Column(header, bar_min=bar_min, bar_max=bar_max, is_bar=True)


def _len(value: str | Text) -> int:
    """Terminal cells `value` takes (a CJK or full-width character two, a combining mark
    none), not its characters."""
    return value.cell_len if isinstance(value, Text) else cell_len(value)


@dataclass
class Sheet:
    """A titled table of `rows` (lists of `Cell`, one per column) that says `empty` instead
    of drawing an empty box. Render it with rich (`console.print(sheet)`), or `plain()`."""

    title: str
    columns: list[Column]
    rows: list[list[Cell]] = field(default_factory=list)
    empty: str = "nothing to show"
    notes: list[Text] = field(default_factory=list)

    def add(self, *cells: Cell | str) -> None:
        """Add a row; plain strings become `Cell(text)`."""
        self.rows.append([c if isinstance(c, Cell) else Cell(c) for c in cells])

    # -- layout ------------------------------------------------------------------------
    def _natural(self, i: int, short: bool) -> int:
        col = self.columns[i]
        header = _len(col.header)
        if col.is_bar:
            return max(header, col.bar_min)
        cells = [_len(row[i].shown(short)) for row in self.rows]
        return max([header, *cells])

    def layout(self, width: int) -> tuple[list[int], list[int], bool]:
        """(visible column indexes, their widths, short ids used) for `width` cells.

        Order of concessions: short forms of identifiers, then optional columns from the
        right, then free text cut down to `min_free`; numbers and headers are never cut."""
        short = False
        visible = list(range(len(self.columns)))

        def fixed_need(idx: list[int], use_short: bool) -> int:
            need = 0
            for i in idx:
                col = self.columns[i]
                natural = self._natural(i, use_short)
                if col.free_text:
                    natural = min(natural, max(col.min_free, _len(col.header)))
                need += natural
            return need + GAP * (len(idx) - 1)

        if fixed_need(visible, short) > width:
            short = any(c.short is not None for row in self.rows for c in row)
        while fixed_need(visible, short) > width:
            droppable = [i for i in visible if self.columns[i].optional]
            if not droppable:
                break
            visible.remove(droppable[-1])
        # give free text and bars the room that is left, free text first
        widths = {}
        for i in visible:
            col = self.columns[i]
            natural = self._natural(i, short)
            widths[i] = (
                min(natural, max(col.min_free, _len(col.header))) if col.free_text else natural
            )
        room = width - sum(widths.values()) - GAP * (len(visible) - 1)
        # free text shares the room in proportion to what each column still lacks, so that
        # a long reason is not left a sliver behind a long purpose
        lacking = {
            i: self._natural(i, short) - widths[i] for i in visible if self.columns[i].free_text
        }
        total_lacking = sum(lacking.values())
        if room > 0 and total_lacking > 0:
            share = min(room, total_lacking)
            given = 0
            for i, lack in lacking.items():
                extra = lack * share // total_lacking
                widths[i] += extra
                given += extra
            room -= given
            for i in lacking:  # what rounding left, in column order
                extra = min(room, self._natural(i, short) - widths[i])
                if extra > 0:
                    widths[i] += extra
                    room -= extra
        for i in visible:
            col = self.columns[i]
            if col.is_bar and room > 0:
                extra = min(room, col.bar_max - widths[i])
                widths[i] += extra
                room -= extra
        return visible, [widths[i] for i in visible], short

    def table(self, width: int) -> Table:
        """The rich table laid out for `width` cells."""
        visible, widths, short = self.layout(width)
        table = Table(
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            padding=(0, 1),
            collapse_padding=True,
            header_style="bold",
            expand=False,
        )
        for i, w in zip(visible, widths, strict=True):
            col = self.columns[i]
            table.add_column(
                col.header,
                justify=col.justify,
                width=w,
                no_wrap=not col.free_text,
                overflow="fold" if col.free_text else "ellipsis",
            )
        for row in self.rows:
            cells: list[str | Text] = []
            for i, w in zip(visible, widths, strict=True):
                cell = row[i]
                if self.columns[i].is_bar and cell.bar is not None:
                    cells.append(cell.bar(w))
                elif self.columns[i].free_text:
                    cells.append(literal(wrap_free_text(cell.shown(short), w)))
                else:
                    cells.append(literal(cell.shown(short)))
            table.add_row(*cells)
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.rows:
            yield Text(self.empty, style="dim")
            return
        yield Text(self.title, style="bold")
        width = options.max_width
        _, widths, _ = self.layout(width)
        if sum(widths) + GAP * (len(widths) - 1) > width:
            yield Text(self.records(width))  # rich would cut numbers to fit: "24 5…"
        else:
            yield self.table(width)
        yield from self.notes

    def records(self, width: int) -> str:
        """Each row as one record, for a terminal narrower than the table's numbers and
        headers: `GPU 0: total 24 576 · available 3 347 · …` (short forms, no bars), wrapped
        at `width` with the lines after the first indented; every figure whole."""
        lines: list[str] = []
        for row in self.rows:
            parts: list[str] = []
            for col, cell in zip(self.columns, row, strict=True):
                if col.is_bar:
                    continue
                shown = cell.shown(True)
                value = shown.plain if isinstance(shown, Text) else shown
                parts.append(value if not parts else f"{col.header} {value}")
            record = (parts[0] + ": " + " · ".join(parts[1:])) if len(parts) > 1 else parts[0]
            wrapped = str(wrap_free_text(record, max(width - 2, 8))).split("\n")
            lines.append("\n  ".join(wrapped))
        return "\n".join(lines)

    # -- plain -------------------------------------------------------------------------
    def plain(self) -> str:
        """Every row whole: aligned columns, two spaces apart, no colour or bars; ends
        with a newline. `empty` alone when there are no rows."""
        if not self.rows:
            return self.empty + "\n"
        idx = [
            i
            for i, col in enumerate(self.columns)
            if col.plain and (not col.is_bar or any(r[i].plain is not None for r in self.rows))
        ]
        grid = [[self.columns[i].header for i in idx]]
        grid += [[row[i].plain_text() for i in idx] for row in self.rows]
        lines = [self.title]
        lines += _align(grid, [self.columns[i].justify for i in idx])
        lines += [n.plain for n in self.notes]
        return "\n".join(lines) + "\n"


_GROUPED_DIGITS = re.compile(r"(?<=\d) (?=\d{3}(?!\d))")
_KEPT_SPACE = "\u00a0"  # textwrap splits at ASCII white space only


def wrap_free_text(value: str | Text, width: int) -> str | Text:
    """`value` broken into lines of at most `width` cells at spaces, never inside a grouped
    number (`24 576` stays on one line); a word longer than `width` is folded. A styled
    `Text`, and text whose characters are not one cell each, is left to rich's own wrapping,
    which counts cells."""
    if isinstance(value, Text) or width < 1 or cell_len(value) <= width:
        return value
    if cell_len(value) != len(value):  # wide or zero-width characters: rich wraps by cells
        return Text(value)
    kept = _GROUPED_DIGITS.sub(_KEPT_SPACE, value)
    lines = textwrap.wrap(kept, width, break_on_hyphens=False) or [""]
    return "\n".join(line.replace(_KEPT_SPACE, " ") for line in lines)


def literal(value: str | Text) -> Text:
    """`value` as text shown as it is: a string becomes a `Text`, so that brackets in what a
    user wrote (a purpose `eval [data shard 3]`, `[/x]`) are characters, not rich markup that
    would vanish or raise `MarkupError`; a `Text` is already literal."""
    return value if isinstance(value, Text) else Text(value)


def _align(grid: list[list[str]], justify: Sequence[str]) -> list[str]:
    """The rows of `grid` with each column padded to its widest cell, in terminal cells (a
    CJK or full-width name takes two a character: padded by characters, `rbroker top --once
    | cat` pushed the columns after one out of line)."""
    widths = [max(cell_len(r[c]) for r in grid) for c in range(len(justify))]
    out = []
    for r in grid:
        cells = []
        for c in range(len(justify)):
            pad = " " * (widths[c] - cell_len(r[c]))
            cells.append(pad + r[c] if justify[c] == "right" else r[c] + pad)
        out.append((" " * GAP).join(cells).rstrip())
    return out


def unique_prefixes(ids: Sequence[str], strip: str = "", min_len: int = 6) -> dict[str, str]:
    """The shortest unique prefix (at least `min_len` characters after `strip`) of each of
    `ids`, like git's short hashes: `{"lease-3f2a1b4c5d6e": "3f2a1b"}`. Any of them
    is accepted back by `resolve_prefix` against the same ids."""
    bare = {i: i[len(strip) :] if strip and i.startswith(strip) else i for i in ids}
    out = {}
    for full, tail in bare.items():
        n = min(min_len, len(tail))
        while n < len(tail) and any(
            other != full and o.startswith(tail[:n]) for other, o in bare.items()
        ):
            n += 1
        out[full] = tail[:n]
    return out


def resolve_prefix(given: str, ids: Iterable[str], strip: str, what: str) -> str:
    """The one id of `ids` that `given` names: the whole id, or a prefix of it with or without
    `strip` (`"3f2a"` and `"lease-3f2a"` both name `"lease-3f2a1b4c5d6e"`), in any case
    (`"LEASE-3F2A"` too). `strip` alone, or the start of it (`"l"`, `"lease"`), names no id,
    even when only one exists: ending someone's lease needs at least one character of its
    own id.

    Raises:
        ValueError: `given` is empty (or only spaces), or only `strip` or the start of it: a
            usage error.
        LookupError: with a message in words: no such id, or an ambiguous prefix (with the
            candidates' short ids, as `unique_prefixes` gives them).
    """
    given = given.strip()
    if not given:
        raise ValueError(f"empty {what} id: give an id or a prefix of one")
    ids = list(ids)
    low = given.lower()
    whole = [i for i in ids if i.lower() == low]
    if len(whole) == 1:
        return whole[0]
    if strip and strip.lower().startswith(low):
        start = "" if low == strip.lower() else f"the start of {strip!r}, "
        raise ValueError(
            f"{given!r} is only {start}the prefix every {what} id has: give at least one "
            f"character of the id after it"
        )
    matches = sorted(
        i for i in ids if i.lower().startswith(low) or i[len(strip) :].lower().startswith(low)
    )
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise LookupError(f"no {what} starts with {given!r}")
    short = unique_prefixes(ids, strip=strip)
    raise LookupError(
        f"{given!r} is ambiguous: it names {len(matches)} {what}s "
        f"({', '.join(short[m] for m in matches)}); give more characters"
    )

"""Payment card numbers in free text: candidates, layouts, issuer prefixes and the Luhn check.

A digit sequence counts as a card number only when all of these hold, so that step counts,
dataset sizes, timestamps, seeds and barcodes are not mistaken for one:

- 13 to 19 digits (ISO/IEC 7812-1), not glued to letters or other digits;
- written the way cards are written: one block of digits, or groups separated by the same
  single space or dash in a card layout (4-4-4-4, 4-4-4-1…3, 4-4-4-4-1…3, 4-6-5, 4-6-4);
- an issuer identification number of a card network, with a length that network issues
  (Visa 4…; Mastercard 51–55, 2221–2720; American Express 34, 37; Discover 6011, 644–649, 65;
  Diners Club 300–305, 36, 38, 39; JCB 3528–3589; UnionPay 62; Maestro 50, 56–69; Mir
  2200–2204);
- the Luhn check digit is right (ISO/IEC 7812-1 annex B).
"""

from __future__ import annotations

import re
from typing import Final

_DIGIT_RUN: Final = re.compile(r"[0-9][0-9 -]{11,}[0-9]")
"""Runs of 13+ digits, spaces and dashes from digit to digit. Linear: one greedy class."""
_ALNUM: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")

_GROUPED_LAYOUTS: Final[frozenset[tuple[int, ...]]] = frozenset(
    {(4, 4, 4, 4), (4, 6, 5), (4, 6, 4)}
    | {(4, 4, 4, last) for last in range(1, 5)}
    | {(4, 4, 4, 4, last) for last in range(1, 4)}
)

# (lowest prefix, highest prefix, allowed lengths); prefixes compared on their own width.
_NETWORKS: Final[tuple[tuple[str, str, frozenset[int]], ...]] = (
    ("4", "4", frozenset({13, 16, 19})),  # Visa
    ("51", "55", frozenset({16})),  # Mastercard
    ("2221", "2720", frozenset({16})),  # Mastercard 2-series
    ("34", "34", frozenset({15})),  # American Express
    ("37", "37", frozenset({15})),  # American Express
    ("6011", "6011", frozenset(range(16, 20))),  # Discover
    ("644", "649", frozenset(range(16, 20))),  # Discover
    ("65", "65", frozenset(range(16, 20))),  # Discover
    ("300", "305", frozenset(range(14, 20))),  # Diners Club International
    ("36", "36", frozenset(range(14, 20))),  # Diners Club
    ("38", "39", frozenset(range(14, 20))),  # Diners Club
    ("3528", "3589", frozenset(range(16, 20))),  # JCB
    ("62", "62", frozenset(range(16, 20))),  # UnionPay
    ("50", "50", frozenset(range(13, 20))),  # Maestro
    ("56", "69", frozenset(range(13, 20))),  # Maestro and others in the 5/6 ranges
    ("2200", "2204", frozenset(range(16, 20))),  # Mir
)


def luhn_ok(digits: str) -> bool:
    """Whether an ASCII digit string passes the Luhn (mod 10) check."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _network_issues(digits: str) -> bool:
    n = len(digits)
    for low, high, lengths in _NETWORKS:
        if n in lengths and low <= digits[: len(low)] <= high:
            return True
    return False


def _is_card(groups: list[str]) -> bool:
    digits = "".join(groups)
    if not 13 <= len(digits) <= 19:
        return False
    if len(groups) > 1 and tuple(len(g) for g in groups) not in _GROUPED_LAYOUTS:
        return False
    return _network_issues(digits) and luhn_ok(digits)


def _first_separator(run: str) -> int:
    positions = [p for p in (run.find(" "), run.find("-")) if p >= 0]
    return min(positions) if positions else len(run)


def _last_separator(run: str) -> int:
    return max(run.rfind(" "), run.rfind("-"), 0)


def _windows(groups: list[str]) -> list[list[str]]:
    """Consecutive groups that could be one card: one block, or a layout starting with 4."""
    out: list[list[str]] = []
    for i, group in enumerate(groups):
        if 13 <= len(group) <= 19:
            out.append([group])
        elif len(group) == 4:
            out.extend(groups[i : i + k] for k in range(3, 6) if i + k <= len(groups))
    return out


def find_card(text: str) -> int | None:
    """Return the offset of the first payment card number in `text`, or None."""
    for match in _DIGIT_RUN.finditer(text):
        start, end = match.span()
        run = match.group()
        # A group glued to letters or digits belongs to another token (a hash, an id, `v2`).
        if start and text[start - 1] in _ALNUM:
            cut = _first_separator(run)
            run, start = run[cut + 1 :], start + cut + 1
        if end < len(text) and text[end] in _ALNUM:
            run = run[: _last_separator(run)]
        if len(run) < 13:
            continue
        # Groups joined by one kind of separator only: "4111 1111 1111 1111", "4111-1111-…".
        for sep, other in ((" ", "-"), ("-", " ")):
            for part in run.split(other):
                if any(_is_card(window) for window in _windows(part.split(sep))):
                    return start
    return None

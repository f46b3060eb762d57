"""Long random-looking strings: the catch-all for keys and tokens without a known format.

A candidate is a run of at least 20 characters of the base64 / base64url alphabet. It is
refused when it looks random rather than like an identifier a person wrote:

- not plain hexadecimal of at most 64 digits (commit ids, SHA-256 digests, MD5 sums, UUIDs
  and GPU UUIDs are common in legitimate purposes; hex secrets of that size are left to the
  context rules such as `password_assignment`);
- letters and digits both present, and at least `_MIN_CLASSES` character classes;
- Shannon entropy of at least 4 bits per character over the run (the detect-secrets family of
  scanners uses 4.5 for base64 on longer strings), with the bar lowered only for long runs;
- many switches between upper case, lower case and digits: a person's names (model names,
  paths, run ids such as `run-2026-11-30-a7`, `Llama-3.1-8B-Instruct`) switch rarely, random
  strings switch on about 60 % of characters;
- few separators, and one piece between them of at least 12 characters: paths and
  hyphenated ids (`trainer-7d9f8c6b5-x2k4p`) are split by `/`, `-`, `_` every few characters.
"""

from __future__ import annotations

import math
import re
from typing import Final

_CANDIDATE: Final = re.compile(r"[A-Za-z0-9+/_-]{20,}={0,2}")
"""Maximal base64/base64url runs of 20+ characters (leftmost-longest, so whole runs)."""

_HEX: Final = re.compile(r"[0-9a-fA-F-]+")
_DIGIT: Final = re.compile(r"[0-9]")
_LETTER: Final = re.compile(r"[A-Za-z]")
_PIECE_SPLIT: Final = re.compile(r"[/_-]")


def _entropy(s: str) -> float:
    n = len(s)
    counts: dict[str, int] = {}
    for ch in s:
        counts[ch] = counts.get(ch, 0) + 1
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _class(ch: str) -> int:
    if ch.isdigit():
        return 0
    if ch.isupper():
        return 1
    if ch.islower():
        return 2
    return 3


def _switch_ratio(token: str) -> float:
    """How often adjacent letters and digits change class, relative to a random shuffle.

    Classes are digit, upper case and lower case; a capital followed by lower case (a word
    in CamelCase) is not a change. A random string scores about 1 whatever its alphabet
    (base64, base36, base32); names people write cluster their classes into words and
    numbers and score well below.
    """
    switches = 0
    pairs = 0
    counts = [0, 0, 0]
    prev = -1
    for ch in token:
        cls = _class(ch)
        if cls == 3:
            prev = -1
            continue
        counts[cls] += 1
        if prev >= 0:
            pairs += 1
            if cls != prev and not (prev == 1 and cls == 2):
                switches += 1
        prev = cls
    total = sum(counts)
    if not pairs or not total:
        return 0.0
    digit, upper, lower = (c / total for c in counts)
    expected = 1.0 - (digit * digit + upper * upper + lower * lower) - upper * lower
    return switches / pairs / expected if expected > 0 else 0.0


def looks_random(token: str) -> bool:
    """Whether one candidate run looks like a random secret rather than an identifier."""
    token = token.strip("/_-+=")
    n = len(token)
    if n < 20:
        return False
    if _HEX.fullmatch(token) and n - token.count("-") <= 64:
        return False
    if _DIGIT.search(token) is None or _LETTER.search(token) is None:
        return False
    separators = sum(token.count(c) for c in "/_-+=")
    if separators * 8 > n:
        return False
    if max(map(len, _PIECE_SPLIT.split(token))) < 12:
        return False  # hyphenated ids of short parts: trainer-7d9f8c6b5-x2k4p
    if _switch_ratio(token) < 0.6:
        return False
    return _entropy(token) >= min(4.0, math.log2(n) - 0.5)


def find_high_entropy(text: str) -> int | None:
    """Return the offset of the first random-looking run in `text`, or None."""
    for match in _CANDIDATE.finditer(text):
        if looks_random(match.group()):
            return match.start()
    return None

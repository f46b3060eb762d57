"""Long random-looking strings: the catch-all for keys and tokens without a known format.

A candidate is a run of at least 20 characters of the base64 / base64url alphabet; a run
with `/` whose segments read as words (a model id `HuggingFaceH4/zephyr-7b-beta`, a path) is
judged segment by segment. It is refused when it looks random rather than like an
identifier a person wrote:

- not plain hexadecimal of at most 64 digits: commit ids, SHA-256 digests, MD5 sums, UUIDs
  and GPU UUIDs are common in legitimate purposes, so hex secrets of that size are left to
  the context rules such as `password_assignment`; not a ULID either;
- letters and digits both present;
- few separators, and one piece between them of at least 12 characters: hyphenated ids
  (`run-2026-11-30-a7`, `trainer-7d9f8c6b5-x2k4p`) are split every few characters;
- many switches between upper case, lower case and digits, measured against a random
  shuffle of the same characters (`_switch_ratio`): random strings score about 1, names
  that people write cluster letters into words and digits into numbers;
- not mostly words: runs like `Hugging`, `Server`, `imagenet` with vowels in them;
- Shannon entropy of at least 4 bits per character (detect-secrets uses 4.5 for base64 on
  long strings), or log2(length) − 0.5 for runs of 20–22 characters, whose entropy cannot
  go much higher (a random 20-character string has about 4.0).

Known misses, by design: hex keys, random strings shorter than 20 characters, base36 or
base32 strings that happen to read like words. Known refusals, by design: random public ids
of 20+ characters (file ids in share links, Ray submission ids) — a share link is a
credential too.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Final

_CANDIDATE: Final = re.compile(r"[A-Za-z0-9+/_-]{20,}={0,2}")
"""Maximal runs of base64/base64url characters, `=` only as padding at the end, so that
`id=<hex>` or `lr=3e-4` are judged by their parts (leftmost-longest: whole runs)."""

_HEX: Final = re.compile(r"[0-9a-fA-F-]+")
_ULID: Final = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")
_DIGIT: Final = re.compile(r"[0-9]")
_LETTER: Final = re.compile(r"[A-Za-z]")
_PIECE_SPLIT: Final = re.compile(r"[/_+-]")
_CLASS_RUN: Final = re.compile(r"[0-9]+|[A-Z]+[a-z]*|[a-z]+|[^A-Za-z0-9]+")
"""Runs of one class; a capital run followed by lower case is one run (CamelCase words)."""
_WORD_RUN: Final = re.compile(r"[A-Z]?[a-z]{3,}|[A-Z]{4,}")
_VOWELS: Final = frozenset("aeiouAEIOU")


def _entropy(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def _switch_ratio(token: str) -> float:
    """How often adjacent letters and digits change class, relative to a random shuffle.

    Classes are digit, upper case and lower case; a capital followed by lower case (a word
    in CamelCase) is not a change. A random string scores about 1 whatever its alphabet
    (base64, base36, base32); names people write cluster their classes into words and
    numbers and score well below.
    """
    digits = sum(map(str.isdigit, token))
    upper = sum(map(str.isupper, token))
    lower = sum(map(str.islower, token))
    total = digits + upper + lower
    switches = 0
    stretches = 0  # maximal alphanumeric stretches between separators
    previous_alnum = False
    for run in _CLASS_RUN.findall(token):
        alnum = run[0].isalnum()
        if alnum and previous_alnum:
            switches += 1
        elif alnum:
            stretches += 1
        previous_alnum = alnum
    pairs = total - stretches
    if pairs <= 0:
        return 0.0
    d, u, lo = digits / total, upper / total, lower / total
    expected = 1.0 - (d * d + u * u + lo * lo) - u * lo
    return switches / pairs / expected if expected > 0 else 0.0


def _mostly_words(token: str) -> bool:
    """Half or more of the characters in word-like runs, 30 % of their letters vowels
    (random letters: 19 %; English, German, French model and data names: 35-45 %)."""
    runs = _WORD_RUN.findall(token)
    letters = sum(map(len, runs))
    if letters * 2 < len(token):
        return False
    vowels = sum(ch in _VOWELS for run in runs for ch in run)
    return vowels * 10 >= letters * 3


def looks_random(token: str) -> bool:
    """Whether one candidate run looks like a random secret rather than an identifier."""
    token = token.strip("/_=+-")
    n = len(token)
    if n < 20:
        return False
    if _HEX.fullmatch(token) and n - token.count("-") <= 64:
        return False
    if _ULID.fullmatch(token) or _DIGIT.search(token) is None or _LETTER.search(token) is None:
        return False
    if sum(token.count(c) for c in "/_=+-") * 8 > n:
        return False
    if max(map(len, _PIECE_SPLIT.split(token))) < 12:
        return False
    if _switch_ratio(token) < 0.6 or _mostly_words(token):
        return False
    return _entropy(token) >= min(4.0, math.log2(n) - 0.5)


def _run_looks_random(run: str) -> bool:
    """A run with `/` (base64 uses it) is judged whole unless one of its segments reads as
    words, as in model ids and paths (`HuggingFaceH4/zephyr-7b-beta`); a random segment of
    its own is enough either way."""
    if "/" not in run:
        return looks_random(run)
    segments = run.split("/")
    if any(looks_random(s) for s in segments if len(s) >= 20):
        return True
    if any(_mostly_words(s.strip("_=+-")) for s in segments if len(s) >= 3):
        return False
    return looks_random(run)


def find_high_entropy(text: str) -> int | None:
    """Return the offset of the first random-looking run in `text`, or None."""
    for match in _CANDIDATE.finditer(text):
        if _run_looks_random(match.group()):
            return match.start()
    return None

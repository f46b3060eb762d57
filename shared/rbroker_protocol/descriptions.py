"""Rules for declared description fields (project, session, purpose, handler): DESIGN §8.

The same rules run on the broker (at lease and job declaration) and on the coordinator (on
every report). A rejection names the rule and never echoes the value.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from typing import Final

MAX_LENGTHS: Final[dict[str, int]] = {
    "owner": 64,
    "project": 64,
    "session": 128,
    "purpose": 200,
    "handler": 128,
    "reason": 200,
}
"""Longest accepted value per field, in characters (not bytes)."""


class DescriptionRejected(ValueError):
    """A description broke a rule. `rule` names it; the message never contains the value.

    Attributes:
        field: which field (`project`, `purpose`, ...).
        rule: the rule's stable name (`empty`, `too_long`, `control_characters`,
            `secret:<kind>`, ...).
    """

    def __init__(self, field: str, rule: str, detail: str) -> None:
        super().__init__(f"{field} rejected by rule {rule}: {detail}")
        self.field = field
        self.rule = rule
        self.detail = detail


_SECRET_PATTERNS: Final[list[tuple[str, re.Pattern[str]]]] = [
    ("private_key_block", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY")),
    ("aws_access_key", re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[A-Z0-9]{16}\b")),
    ("github_token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})")),
    ("slack_token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("openai_key", re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}")),
    ("huggingface_token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("google_api_key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    ("stripe_key", re.compile(r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    ("url_credentials", re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s/:@]+:[^\s/@]+@", re.I)),
    (
        "password_assignment",
        re.compile(
            r"\b(?:password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key)\s*[:=]\s*\S+",
            re.I,
        ),
    ),
    ("email_address", re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b")),
]

_CARD_CANDIDATE: Final = re.compile(r"\b(?:\d[ -]?){13,19}\b")
_TOKEN: Final = re.compile(r"[A-Za-z0-9+/=_-]{24,}")


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _entropy_bits_per_char(s: str) -> float:
    counts = Counter(s)
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _looks_high_entropy(token: str) -> bool:
    """A long token mixing character classes with high Shannon entropy (≥ 4 bits/char)."""
    classes = sum(
        (
            any(c.islower() for c in token),
            any(c.isupper() for c in token),
            any(c.isdigit() for c in token),
        )
    )
    return classes >= 3 and _entropy_bits_per_char(token) >= 4.0


def find_secret(value: str) -> str | None:
    """Return the name of the first secret rule `value` trips, or None.

    Rules: key formats (cloud, vendor tokens, JWT, PEM blocks), credential assignments,
    URLs with credentials, e-mail addresses, payment cards (Luhn) and long high-entropy
    tokens. The value itself is never returned.
    """
    for rule, pattern in _SECRET_PATTERNS:
        if pattern.search(value):
            return rule
    for match in _CARD_CANDIDATE.finditer(value):
        digits = re.sub(r"\D", "", match.group())
        if 13 <= len(digits) <= 19 and _luhn_ok(digits):
            return "payment_card"
    for match in _TOKEN.finditer(value):
        if _looks_high_entropy(match.group()):
            return "high_entropy"
    return None


def check_description(field: str, value: object) -> str:
    """Validate one description field and return it stripped.

    Args:
        field: one of `MAX_LENGTHS`' keys.
        value: the declared text.

    Returns:
        The value with surrounding whitespace removed.

    Raises:
        DescriptionRejected: not a string, empty, longer than `MAX_LENGTHS[field]`
            characters, containing control or unprintable characters, or tripping a secret
            rule (`secret:<kind>`). The message names the rule, never the value.
    """
    if not isinstance(value, str):
        raise DescriptionRejected(field, "not_text", f"expected text, got {type(value).__name__}")
    text = value.strip()
    if not text:
        raise DescriptionRejected(field, "empty", "must not be empty")
    limit = MAX_LENGTHS.get(field, 200)
    if len(text) > limit:
        raise DescriptionRejected(
            field, "too_long", f"{len(text)} characters, at most {limit} allowed"
        )
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn"):
            raise DescriptionRejected(
                field, "control_characters", "control or unprintable characters are not allowed"
            )
    secret = find_secret(text)
    if secret is not None:
        raise DescriptionRejected(
            field, f"secret:{secret}", "looks like it contains a secret or personal data"
        )
    return text

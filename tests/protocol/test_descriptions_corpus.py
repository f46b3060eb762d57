"""The labelled description corpus: recall on secrets, false positives on real purposes.

tests/data/descriptions/legit.txt holds purposes that must pass; secrets.txt holds
`rule<TAB>text` lines with synthetic secrets that must be refused by that rule.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rbroker_protocol.descriptions import (
    SECRET_KINDS,
    DescriptionRejected,
    check_description,
)

CORPUS = Path(__file__).parent.parent / "data" / "descriptions"
MAX_FALSE_POSITIVE_RATE = 0.01


def _lines(name: str) -> list[str]:
    text = (CORPUS / name).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


LEGIT = _lines("legit.txt")
SECRETS = [tuple(line.split("\t", 1)) for line in _lines("secrets.txt")]


def _rejection(text: str) -> DescriptionRejected | None:
    try:
        check_description("purpose", text)
    except DescriptionRejected as exc:
        return exc
    return None


def test_corpus_sizes() -> None:
    assert len(LEGIT) >= 200
    assert len(SECRETS) >= 100
    assert len(set(LEGIT)) == len(LEGIT), "duplicate legitimate lines"
    assert all(len(pair) == 2 for pair in SECRETS), "secrets.txt lines are rule<TAB>text"


def test_corpus_labels_cover_every_secret_kind() -> None:
    labels = {rule for rule, _ in SECRETS}
    assert labels <= set(SECRET_KINDS), labels - set(SECRET_KINDS)
    assert set(SECRET_KINDS) <= labels, f"no corpus example for {set(SECRET_KINDS) - labels}"


def test_recall_and_false_positive_rate(capsys: pytest.CaptureFixture[str]) -> None:
    false_positives = [(text, exc.rule) for text in LEGIT if (exc := _rejection(text))]
    missed = [(rule, text) for rule, text in SECRETS if _rejection(text) is None]
    recall = 1 - len(missed) / len(SECRETS)
    fp_rate = len(false_positives) / len(LEGIT)
    with capsys.disabled():
        print(
            f"\ndescription corpus: recall {recall:.1%} on {len(SECRETS)} secrets, "
            f"false positives {fp_rate:.1%} on {len(LEGIT)} legitimate purposes"
        )
    assert not missed, f"secrets accepted: {[rule for rule, _ in missed]}"
    assert fp_rate <= MAX_FALSE_POSITIVE_RATE, false_positives


@pytest.mark.parametrize(
    ("rule", "text"), SECRETS, ids=[f"{r}-{i}" for i, (r, _) in enumerate(SECRETS)]
)
def test_each_secret_is_refused_by_its_rule(rule: str, text: str) -> None:
    exc = _rejection(text)
    assert exc is not None
    assert exc.rule == f"secret:{rule}"
    assert exc.field == "purpose"


_MESSAGE_VOCABULARY = re.compile(r"[A-Za-z ,:_]+")


@pytest.mark.parametrize(
    ("rule", "text"), SECRETS, ids=[f"{r}-{i}" for i, (r, _) in enumerate(SECRETS)]
)
def test_rejections_do_not_echo_the_text(rule: str, text: str) -> None:
    """No 8-character window of the line shows up in the error, except plain words such as
    "password" or a rule name such as `aws_secret_key` that the message uses itself."""
    exc = _rejection(text)
    assert exc is not None
    for message in (str(exc), exc.detail):
        for i in range(len(text) - 7):
            window = text[i : i + 8]
            if window in message:
                assert _MESSAGE_VOCABULARY.fullmatch(window), (rule, window)

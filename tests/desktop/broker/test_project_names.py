"""One name, one project (`rbroker.broker.project_names`, the description rules'
`mixed_scripts`, `shows_nothing` and `combining_marks`): a project declared as `Vision` or
the full-width `ｖｉｓｉｏｎ` is the listed `vision` (its members list applies, its share is
counted, every view shows `vision`); `vіsion` with a Cyrillic `і` and names that show
nothing are refused; a config that lists one project in two spellings is refused in one
line. On the in-process broker with a caller identity (manual clock)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rbroker.broker.config import BrokerConfig
from rbroker.broker.holders import Holder
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.localapi import AcquireParams
from tests.conftest import SINGLE_24G
from tests.desktop.inprocess import InProcessBroker, SleeperPool

SAME = ["Vision", "VISION", " vision ", "ｖｉｓｉｏｎ", "Ｖｉｓｉｏｎ", "v\u0131sion"]


def _acquire(h: InProcessBroker, holder: Holder, owner: str, project: str) -> Any:
    p = AcquireParams(mib=1000, project=project, session="s", purpose="p")
    task = h.loop.create_task(h.broker.acquire(p, owner, holder, 1, False))
    h.spin()
    return task.exception() or task.result()


@pytest.mark.parametrize("spelling", SAME)
def test_another_spelling_of_a_listed_project_is_that_project(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool, spelling: str
) -> None:
    h = make_inprocess(
        SINGLE_24G, persist=False, members={"vision": ("alice",)}, shares={"vision": 3.0}
    )
    refused = _acquire(h, pool.spawn()[1], "carol", spelling)
    assert isinstance(refused, RpcError) and refused.name is ErrorCode.NOT_A_MEMBER
    assert refused.data == {"project": "vision", "user": "carol"}
    lease = _acquire(h, pool.spawn()[1], "alice", spelling)
    assert lease.project == "vision"  # as listed, in every view
    assert [x["project"] for x in h.broker.leases_view()["leases"]] == ["vision"]
    job = h.broker.declare_job("alice", spelling, "train", "h", None, 1, None)
    assert job["project"] == "vision"
    with pytest.raises(RpcError) as job_refused:
        h.broker.declare_job("carol", spelling, "train", "h", None, 1, None)
    assert job_refused.value.name is ErrorCode.NOT_A_MEMBER


def test_an_unlisted_project_keeps_its_spelling(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h = make_inprocess(SINGLE_24G, persist=False, members={"vision": ("alice",)})
    assert _acquire(h, pool.spawn()[1], "carol", "NLP-Team").project == "NLP-Team"


@pytest.mark.parametrize(
    ("project", "rule"),
    [
        ("v\u0456sion", "mixed_scripts"),  # Cyrillic і
        ("visi\u043en", "mixed_scripts"),  # Cyrillic о
        ("\u03bdision", "mixed_scripts"),  # Greek ν
        ("\u3164", "shows_nothing"),  # Hangul filler
        ("\u2800\u2800", "shows_nothing"),  # braille blanks
        ("\u3164 \u3164", "shows_nothing"),
        ("v" + "\u0336" * 8 + "ision", "combining_marks"),
    ],
)
def test_names_that_pass_for_others_or_show_nothing_are_refused(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool, project: str, rule: str
) -> None:
    h = make_inprocess(SINGLE_24G, persist=False, members={"vision": ("alice",)})
    refused = _acquire(h, pool.spawn()[1], "carol", project)
    assert isinstance(refused, RpcError) and refused.name is ErrorCode.DESCRIPTION_REJECTED
    assert refused.data == {"field": "project", "rule": rule}
    assert project.strip() not in refused.message and "\n" not in refused.message
    assert not h.broker.leases


@pytest.mark.parametrize(
    ("project", "listed"),
    [
        ("\ua4e6\ua4f2\ua4e2\ua4f2\ua4f3\ua4e0", "vision"),  # all Lisu: ꓦꓲꓢꓲꓳꓠ, "VISION"
        ("\u0455\u0441\u043e\u0440\u0435", "scope"),  # all Cyrillic: ѕсоре
        ("n1p", "nlp"),  # a digit for a letter
        ("nIp", "nlp"),  # a capital I for an l
    ],
)
def test_a_name_that_looks_like_a_listed_project_is_refused(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool, project: str, listed: str
) -> None:
    """A name in one script (no `mixed_scripts`) that a reader could take for a listed
    project (UTS #39's skeleton, in either case) would be another project shown as it."""
    h = make_inprocess(SINGLE_24G, persist=False, members={listed: ("alice",)})
    refused = _acquire(h, pool.spawn()[1], "carol", project)
    assert isinstance(refused, RpcError) and refused.name is ErrorCode.DESCRIPTION_REJECTED
    assert refused.data == {"field": "project", "rule": "confusable"}
    assert f"could be taken for {listed!r}" in refused.message and "\n" not in refused.message
    with pytest.raises(RpcError) as job_refused:
        h.broker.declare_job("carol", project, "train", "h", None, 1, None)
    assert job_refused.value.data["rule"] == "confusable"
    assert not h.broker.leases
    # the listed name itself, and names that only share letters, pass
    assert _acquire(h, pool.spawn()[1], "alice", listed).project == listed
    assert _acquire(h, pool.spawn()[1], "carol", "vlslon").project == "vlslon"


def test_two_listed_projects_that_look_alike_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'nlp' and 'n1p' look alike") as exc:
        BrokerConfig(tmp_path / "s", tmp_path, members={"nlp": ["a"]}, shares={"n1p": 1.0})
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("members", "shares"),
    [
        ({"vision": ["alice"], "Vision": ["bob"]}, {}),
        ({}, {"nlp": 2.0, "ＮＬＰ": 1.0}),
        ({"vision": ["alice"]}, {"VISION": 2.0}),
    ],
)
def test_one_project_listed_in_two_spellings_is_refused_in_one_line(
    members: dict[str, Any], shares: dict[str, float], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="are one project to the broker") as exc:
        BrokerConfig(tmp_path / "s", tmp_path, members=members, shares=shares)
    assert "\n" not in str(exc.value)


def test_a_share_counts_every_spelling_of_its_project(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    """The weights are looked up by the listed name: a request declared `VISION` carries
    `vision`'s weight in the shares view."""
    h = make_inprocess(SINGLE_24G, persist=False, shares={"vision": 3.0, "*": 1.0})
    _acquire(h, pool.spawn()[1], "alice", "VISION")
    shares = {s["project"]: s for s in h.broker.shares_view()}
    assert (shares["vision"]["weight"], shares["vision"]["granted_mib"]) == (3.0, 1000)
    assert "VISION" not in shares

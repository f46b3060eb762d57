"""The fleet API in pages (issue 44, "big answers"): `GET /api/v1/fleet?limit=N&after=ID`
gives at most N computers after computer ID in the fleet's order (name, then id) and
`next_after` for the next page; a bad query is a 400 naming the parameter."""

from __future__ import annotations

import pytest

from rbroker_server.admin import operations as admin
from tests.server.conftest import Coordinator


def _pages(coordinator: Coordinator, group: str, limit: int) -> list[list[str]]:
    pages, after = [], None
    while True:
        query = f"limit={limit}" + (f"&after={after}" if after else "")
        r = coordinator.http.get(f"/api/v1/fleet?{query}", headers=coordinator.viewer(group))
        assert r.status_code == 200, r.text
        body = r.json()
        pages.append([c["name"] for c in body["computers"]])
        after = body["next_after"]
        if after is None:
            return pages
        assert after == body["computers"][-1]["id"]


def test_pages_walk_the_whole_fleet_once_in_order(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    coordinator.group("beta")
    names = ["lab-3", "lab-1", "gpu-box", "lab-2", "lab-1", "zeta"]  # a name twice
    enrolled = [coordinator.enroll("alpha", n) for n in names]
    for computer in enrolled:
        assert computer.report().status_code == 200
    coordinator.enroll("beta", "other-group").report()
    whole = coordinator.fleet("alpha")
    assert whole["next_after"] is None  # no limit: all of them, as before
    order = [c["name"] for c in whole["computers"]]
    assert order == sorted(names)
    assert _pages(coordinator, "alpha", 2) == [order[0:2], order[2:4], order[4:6]]
    assert _pages(coordinator, "alpha", 4) == [order[0:4], order[4:6]]
    assert _pages(coordinator, "alpha", 6) == [order]
    assert _pages(coordinator, "alpha", 1000) == [order]
    # a revoked computer leaves the pages, as it leaves the fleet
    admin.revoke_computer(coordinator.engine, enrolled[2].id)
    walked = [name for page in _pages(coordinator, "alpha", 2) for name in page]
    assert walked == [n for n in order if n != "gpu-box"]


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("limit=0", "limit must be a whole number from 1 to 1000"),
        ("limit=1001", "limit must be a whole number from 1 to 1000"),
        ("limit=-1", "limit must be a whole number from 1 to 1000"),
        ("limit=2.5", "limit must be a whole number from 1 to 1000"),
        ("limit=1&limit=2", "limit is given 2 times"),
        ("after=", "after must be a computer id"),
        ("after=c_nope", "after: no computer 'c_nope' in this group"),
        ("page=2", "unknown query parameter 'page'"),
    ],
)
def test_a_bad_page_query_is_named(coordinator: Coordinator, query: str, words: str) -> None:
    coordinator.group("alpha")
    coordinator.group("beta")
    other = coordinator.enroll("beta", "theirs")
    r = coordinator.http.get(f"/api/v1/fleet?{query}", headers=coordinator.viewer("alpha"))
    assert r.status_code == 400, r.text
    assert words in r.json()["detail"], r.text
    # another group's computer is as unknown as none
    r = coordinator.http.get(f"/api/v1/fleet?after={other.id}", headers=coordinator.viewer("alpha"))
    assert r.status_code == 400 and "no computer" in r.json()["detail"], r.text

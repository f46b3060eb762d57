"""Usage history: the daily rollup the report writes keep (granted and used MiB-hours between
consecutive reports, capped at the stale limit), `GET /api/v1/usage` as JSON and CSV,
group-scoped, its refusals, pruning, and the web view's usage page (over HTTP; the chart in
a browser, fed by real brokers, is tests/e2e/test_web_browser.py's)."""

from __future__ import annotations

import contextlib
import csv
import io
import time
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from rbroker_protocol import signing
from rbroker_protocol.reports import LeaseReport
from rbroker_protocol.usage import UsageView
from rbroker_server.db import engine as db
from rbroker_server.db import maintenance
from rbroker_server.reports import service
from rbroker_server.reports.cache import load_view
from rbroker_server.usage import rollup
from tests.fakes.reports import GPU_A, GPU_B, payload
from tests.server.conftest import Coordinator, EnrolledComputer
from tests.server.test_web import sign_in

HOUR = 3600.0


def _leases() -> list[LeaseReport]:
    """vision/alice: 4 096 MiB on each of two GPUs, 1 000 MiB used on each; nlp/bob: 2 048
    MiB on one, nothing used yet; a released lease, which never counts."""
    return [
        LeaseReport(
            lease_id="lease-1",
            gpu_uuids=[GPU_A, GPU_B],
            granted_mib=4096,
            owner="alice",
            project="vision",
            observed_mib={GPU_A: 1000, GPU_B: 1000},
        ),
        LeaseReport(
            lease_id="lease-2", gpu_uuids=[GPU_A], granted_mib=2048, owner="bob", project="nlp"
        ),
        LeaseReport(
            lease_id="lease-3",
            gpu_uuids=[GPU_A],
            granted_mib=9999,
            owner="carol",
            project="vision",
            state="released",
        ),
    ]


def _timed_report(pc: EnrolledComputer, **kw: Any) -> tuple[float, float]:
    """Send a report with `_leases()`; (time before sending, time after the answer)."""
    before = time.time()
    r = pc.report(payload(leases=_leases(), run_id=kw.get("run_id", pc.run_id)), **kw)
    assert r.status_code == 200 and r.json()["applied"], r.text
    return before, time.time()


def _usage(c: Coordinator, group: str, query: str = "") -> dict[str, Any]:
    r = c.http.get(f"/api/v1/usage{query}", headers=c.viewer(group))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    UsageView.model_validate(r.json())  # the declared shape
    return dict(r.json())


def _totals(body: dict[str, Any]) -> dict[str, tuple[float, float]]:
    return {t["name"]: (t["granted_mib_hours"], t["used_mib_hours"]) for t in body["totals"]}


def test_usage_is_integrated_between_reports_and_capped(
    coordinator_factory: Callable[..., Coordinator],
) -> None:
    c = coordinator_factory(stale_after_s=0.5)
    c.group("alpha")
    c.group("beta")
    pc = c.enroll("alpha")
    c.enroll("beta", "lab-beta")
    first_before, first_after = _timed_report(pc)  # a run's first report adds nothing
    assert _usage(c, "alpha")["usage"] == []
    time.sleep(0.2)
    second_before, second_after = _timed_report(pc)
    # the server's interval between the two receive times lies within these bounds
    low_s, high_s = second_before - first_after, min(0.5, second_after - first_before)
    by_project = _usage(c, "alpha", "?days=2&by=project")
    assert by_project["by"] == "project" and by_project["days"] == 2
    totals = _totals(by_project)
    assert set(totals) == {"vision", "nlp"}  # the released lease counts for nobody
    granted, used = totals["vision"]
    assert 8192 * low_s / HOUR <= granted + 0.001 and granted <= 8192 * high_s / HOUR + 0.001
    assert used == pytest.approx(granted * 2000 / 8192, abs=0.002)
    assert totals["nlp"][1] == 0.0 and totals["nlp"][0] == pytest.approx(granted / 4, abs=0.002)
    assert list(totals) == ["vision", "nlp"]  # the most granted first
    assert {d["name"] for d in by_project["usage"]} == {"vision", "nlp"}
    by_user = _totals(_usage(c, "alpha", "?days=2&by=user"))
    assert by_user == {"alice": totals["vision"], "bob": totals["nlp"]}

    # silent past the stale limit: the gap adds at most stale_after_s (0.5 s)
    time.sleep(0.8)
    _timed_report(pc)
    granted_after, _ = _totals(_usage(c, "alpha", "?days=2"))["vision"]
    assert granted_after - granted == pytest.approx(8192 * 0.5 / HOUR, abs=0.002)
    # a new run's first report adds nothing
    time.sleep(0.1)
    _timed_report(pc, run_id="run-2", seq=1)
    assert _totals(_usage(c, "alpha", "?days=2"))["vision"][0] == granted_after

    # another group sees none of it
    assert _usage(c, "beta")["usage"] == [] and _usage(c, "beta")["group"] == "beta"
    # CSV: a header, then a row per day and name
    r = c.http.get("/api/v1/usage?days=2&by=user&format=csv", headers=c.viewer("alpha"))
    assert r.status_code == 200 and r.headers["content-type"] == "text/csv; charset=utf-8"
    assert "attachment" in r.headers["content-disposition"]
    rows = list(csv.reader(io.StringIO(r.text)))
    assert rows[0] == ["day", "user", "granted_mib_hours", "used_mib_hours"]
    assert {row[1] for row in rows[1:]} == {"alice", "bob"}
    alice = sum(float(row[2]) for row in rows[1:] if row[1] == "alice")
    assert alice == pytest.approx(granted_after, abs=0.002)
    assert "lease-1" not in r.text and "GPU-" not in r.text  # names and numbers only

    # the web view's page: the chart and totals, and the CSV behind the session
    client, _ = sign_in(c, c.tokens["alpha"])
    with contextlib.closing(client):
        page = client.get("/usage?days=7&by=project")
        assert page.status_code == 200, page.text
        assert 'class="usage-bars"' in page.text and 'class="granted"' in page.text
        assert "vision" in page.text and "lab-beta" not in page.text
        download = client.get("/usage.csv?days=7")
        assert download.status_code == 200 and download.text.startswith("day,project,")
        bad = client.get("/usage?days=0")
        assert bad.status_code == 400 and "days must be a whole number" in bad.text
    assert c.http.get("/usage").status_code == 303  # signed out: to /signin

    # pruned once the day leaves the window
    today = datetime.now(UTC).date()
    later = datetime.combine(today + timedelta(days=400), datetime.min.time(), UTC)
    assert maintenance.prune(c.engine, c.settings).usage_rows == 0
    assert maintenance.prune(c.engine, c.settings, later + timedelta(hours=1)).usage_rows >= 2
    assert _usage(c, "alpha")["usage"] == []


BAD_QUERIES = [
    ("?days=0", "days must be a whole number from 1 to 400 (the days kept), not '0'"),
    ("?days=abc", "days must be a whole number from 1 to 400"),
    ("?days=401", "not '401'"),
    ("?days=" + "9" * 5000, "days must be a whole number"),
    ("?by=team", "by must be one of project, user, not 'team'"),
    ("?format=xml", "format must be one of json, csv, not 'xml'"),
    ("?day=3", "unknown query parameter 'day' (known: days, by, format, top)"),
    ("?top=0", "top must be a whole number from 1 to 1000 (the names shown), not '0'"),
    ("?top=1001", "not '1001'"),
    ("?top=ten", "top must be a whole number from 1 to 1000"),
    ("?days=1&days=2", "days is given 2 times; give it once"),
]


def test_bad_usage_queries_get_one_line(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    assert coordinator.http.get("/api/v1/usage?days=0").status_code == 401  # credentials first
    for query, words in BAD_QUERIES:
        r = coordinator.http.get(f"/api/v1/usage{query}", headers=coordinator.viewer("alpha"))
        assert r.status_code == 400 and r.headers["content-type"] == "application/json", query
        detail = r.json()["detail"]
        assert words in detail and "\n" not in detail and len(detail) < 200, detail


def test_an_interval_is_counted_once_when_two_writes_start_from_one_view(
    coordinator: Coordinator,
) -> None:
    """Two reports decided on the same view of the computer (another process wrote first,
    or both were in flight): the second's UPDATE finds another previous report and applies
    nothing; decided again on a fresh view, it adds only its own interval."""
    coordinator.group("alpha")
    pc = coordinator.enroll("alpha")
    _timed_report(pc)
    settings, engine = coordinator.settings, coordinator.engine
    view = load_view(engine, pc.id)
    assert view is not None and view.last_seen_at is not None
    start = view.last_seen_at

    def planned(seq: int, at: datetime, on: Any) -> service.Write:
        body = signing.encode_envelope(
            pc.envelope(payload(leases=_leases(), run_id=pc.run_id), seq=seq)
        )
        env = service.parse(body, settings)
        checked = service.decode(env, service.verify(env, on), at)
        w = service.plan(checked, on, at, settings)
        assert isinstance(w, service.Write)
        return w

    first = planned(2, start + timedelta(seconds=2), view)
    second = planned(3, start + timedelta(seconds=4), view)
    with db.write_transaction(engine) as conn:
        assert service.write(conn, first) == "applied"
    with db.write_transaction(engine) as conn:
        assert service.write(conn, second) == "not_updated"
    fresh = load_view(engine, pc.id)
    again = planned(3, start + timedelta(seconds=4), fresh)
    with db.write_transaction(engine) as conn:
        assert service.write_many(conn, [again]) == ["applied"]
    with engine.connect() as conn:
        granted = conn.execute(
            sa.text("SELECT sum(granted_mib_hours) FROM daily_usage WHERE project = 'vision'")
        ).scalar_one()
    assert granted == pytest.approx(8192 * 4 / HOUR)  # 2 s + 2 s, never 2 s + 4 s


def test_rollup_splits_at_midnight_and_sums_by_name() -> None:
    midnight = datetime(2026, 12, 5, tzinfo=UTC)
    assert rollup.day_parts(midnight - timedelta(seconds=3), midnight + timedelta(seconds=1)) == [
        (date(2026, 12, 4), 3.0),
        (date(2026, 12, 5), 1.0),
    ]
    assert rollup.day_parts(midnight, midnight) == []
    leases = [
        {"project": "p", "owner": "u", "granted_mib": 100, "gpu_uuids": ["a", "b"]},
        {
            "project": "p",
            "owner": "u",
            "granted_mib": 50,
            "gpu_uuids": ["a"],
            "observed_mib": {"a": 70},
        },
        {"project": "x" * 80, "owner": "", "granted_mib": 10, "gpu_uuids": ["a"]},
        {"project": "q", "owner": "u", "granted_mib": 10, "gpu_uuids": ["a"], "state": "expired"},
    ]
    assert rollup.lease_mib(leases) == {("p", "u"): (250, 70), ("x" * 64, ""): (10, 0)}
    rows = rollup.usage_rows(
        "c1", leases, midnight - timedelta(seconds=30), midnight + timedelta(seconds=3), 6.0
    )
    # capped at 6 s: 3 s on each day
    assert [(r["day"], r["project"]) for r in rows] == [
        (date(2026, 12, 4), "p"),
        (date(2026, 12, 4), "x" * 64),
        (date(2026, 12, 5), "p"),
        (date(2026, 12, 5), "x" * 64),
    ]
    assert rows[0]["granted_mib_hours"] == pytest.approx(250 * 3 / HOUR)
    assert rows[0]["used_mib_hours"] == pytest.approx(70 * 3 / HOUR)
    assert rollup.usage_rows("c1", leases, None, midnight, 6.0) == []  # first of a run
    assert rollup.usage_rows("c1", leases, midnight, midnight - timedelta(seconds=1), 6.0) == []
    assert rollup.usage_rows("c1", [], midnight - timedelta(seconds=1), midnight, 6.0) == []

"""The coordinator's own health on `/metrics`: reports applied and refused by reason, the
ingest latency histogram, the writer's queue, database errors, rate-limit refusals and
webhook deliveries, beside the group's fleet, with the names the operator guide gives."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rbroker_server.edge.ratelimit import CREDENTIAL_FAILURES
from tests.server.conftest import Coordinator

GUIDE = Path(__file__).parents[2] / "docs" / "operator-guide.md"
NAMES = (
    "rbroker_server_reports_applied_total",
    "rbroker_server_reports_refused_total",
    "rbroker_server_report_ingest_seconds",
    "rbroker_server_report_writer_queued_reports",
    "rbroker_server_database_errors_total",
    "rbroker_server_rate_limit_refusals_total",
    "rbroker_server_webhook_deliveries_total",
    "rbroker_server_webhook_queued_deliveries",
    "rbroker_server_open_connections",
    "rbroker_server_connections_refused_total",
    "rbroker_server_connections_cut_total",
)


def _scrape(c: Coordinator, group: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = c.http.get("/metrics", headers=c.viewer(group))
    assert r.status_code == 200, r.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # counters of this process
def test_health_metrics_count_what_the_coordinator_did(
    coordinator_factory: Callable[..., Coordinator],
) -> None:
    c = coordinator_factory(health_groups=("ops",))
    c.group("ops")
    c.group("vision")
    pc = c.enroll("vision")
    before = _scrape(c, "ops")
    for name in NAMES:
        assert any(n.startswith(name) for n, _ in before), name
    # the process's counters count every group's reports: a group not named in
    # health_groups sees its own queued deliveries, none of them
    theirs = {n for n, _ in _scrape(c, "vision") if n.startswith("rbroker_server_")}
    assert theirs == {"rbroker_server_webhook_queued_deliveries"}
    env = pc.envelope()
    assert pc.send(env).json()["applied"] is True
    assert pc.send(env).json()["code"] == "not_newer"
    assert pc.send(b"{}").status_code == 401
    assert pc.send(b"[" * 200 + b"]" * 200).status_code == 400
    for _ in range(CREDENTIAL_FAILURES + 1):  # one past the network's limit
        token = f"rbv_{secrets.token_hex(6)}_{secrets.token_urlsafe(24)}"
        c.http.get("/api/v1/fleet", headers={"authorization": f"Bearer {token}"})
    after = _scrape(c, "ops")

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert grew("rbroker_server_reports_applied_total") == 1
    assert grew("rbroker_server_reports_refused_total", reason="not_newer") == 1
    assert grew("rbroker_server_reports_refused_total", reason="unauthenticated") == 1
    assert grew("rbroker_server_reports_refused_total", reason="malformed") == 1
    assert grew("rbroker_server_report_ingest_seconds_count") == 3  # the nested one: no body
    assert after[("rbroker_server_report_writer_queued_reports", ())] == 0
    assert grew("rbroker_server_rate_limit_refusals_total", limit="credentials") >= 1
    assert after[("rbroker_server_webhook_queued_deliveries", ())] == 0
    # connections: tests/server/test_slow_clients.py (these servers run without the guard)
    for outcome in ("sent", "retry", "failed"):
        assert ("rbroker_server_webhook_deliveries_total", (("outcome", outcome),)) in after
    # the guide's names only: no `*_created` series beside them (prometheus_client's default)
    assert [n for n, _ in after if n.endswith("_created")] == []


def test_the_operator_guide_names_every_health_metric() -> None:
    guide = GUIDE.read_text(encoding="utf-8")
    for name in NAMES:
        assert re.search(rf"`{name}[{{`]", guide), name

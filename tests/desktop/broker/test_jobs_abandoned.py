"""A job declared and left (no worker, no connection, no report) does not show as `stalled`
for ever: after `job_abandon_s` (default 24 h) unattended it ends `cancelled`, reason
`abandoned: …`, and is kept with the finished jobs. On the in-process harness with the
manual clock: nothing runs unless the test runs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rbroker.broker.config import BrokerConfig
from tests.conftest import SINGLE_24G
from tests.desktop.inprocess import InProcessBroker

DAY_S = 24 * 3600.0
REASON = "abandoned: no worker, connection or report for 24 h"


def _declare(h: InProcessBroker, conn_id: int | None) -> str:
    job = h.broker.declare_job("alice", "p", "embed", "tests.embed", 100, 2, conn_id)
    return str(job["job_id"])


def _job(h: InProcessBroker, job_id: str) -> dict[str, Any]:
    return dict(next(j for j in h.broker.jobs_view(True) if j["job_id"] == job_id))


def _turn(h: InProcessBroker, seconds: float) -> None:
    """`seconds` later: the holder check (stalls) and a tick (abandoned jobs)."""
    h.clock.advance(seconds)
    h.broker._check_holders()
    h.tick(0.1)


def test_a_job_left_stalled_for_a_day_ends_abandoned_and_stays_in_history(
    h: InProcessBroker,
) -> None:
    assert BrokerConfig(h.config.socket_path, h.config.data_dir).job_abandon_s == DAY_S
    events: list[tuple[str, dict[str, Any]]] = []
    h.broker.subscribe(lambda kind, data: events.append((kind, data)))
    job_id = _declare(h, conn_id=5)
    h.broker.connection_closed(5)  # the declarer went away; no worker ever came
    _turn(h, 1.0)
    assert _job(h, job_id)["state"] == "stalled"
    _turn(h, DAY_S - 1.0)
    assert _job(h, job_id)["state"] == "stalled"  # a day since it stalled not yet over
    assert h.broker.jobs.open_of("alice") == 1
    _turn(h, 1.0)
    job = _job(h, job_id)
    assert (job["state"], job["reason"]) == ("cancelled", REASON)
    assert job["finished_at"] == h.clock.wall()
    assert ("job", {"job_id": job_id, "state": "cancelled"}) in events
    assert [j["job_id"] for j in h.broker.jobs_view(False)] == []  # not in the active view
    assert h.broker.jobs.open_of("alice") == 0  # no longer counts against too_many_jobs
    _turn(h, DAY_S)
    assert _job(h, job_id)["reason"] == REASON  # ended once, kept


def test_a_report_or_an_attached_connection_keeps_a_job_from_being_abandoned(
    h: InProcessBroker,
) -> None:
    reported = _declare(h, conn_id=None)
    attached = _declare(h, conn_id=7)  # its declarer stays connected, however long
    _turn(h, 1.0)
    assert _job(h, reported)["state"] == "stalled"
    _turn(h, DAY_S - 3600.0)
    h.broker.report_job(reported, "alice", "c-0", 10, 0, None)  # a worker's last word
    _turn(h, 1.0)
    assert _job(h, reported)["state"] == "stalled"  # nothing attached after the report
    _turn(h, DAY_S - 1.0)
    assert _job(h, reported)["state"] == "stalled"  # a day since the report not yet over
    _turn(h, 1.0)
    assert _job(h, reported)["reason"] == REASON
    assert _job(h, reported)["completed_items"] == 10  # its counts are kept
    assert _job(h, attached)["state"] == "queued"


def test_an_abandoned_end_survives_a_restart_and_a_restart_restarts_the_count(
    make_inprocess: Callable[..., InProcessBroker],
) -> None:
    h = make_inprocess(SINGLE_24G, job_abandon_s=3600.0)
    left = _declare(h, conn_id=None)
    _turn(h, 1.0)
    _turn(h, 1800.0)
    h.restart()  # the stall is counted again from the restart: the broker was not watching
    assert _job(h, left)["state"] == "stalled"
    _turn(h, 3599.0)
    assert _job(h, left)["state"] == "stalled"
    _turn(h, 1.0)
    assert _job(h, left)["reason"] == "abandoned: no worker, connection or report for 1 h"
    h.restart()
    assert (_job(h, left)["state"], _job(h, left)["reason"]) == (
        "cancelled",
        "abandoned: no worker, connection or report for 1 h",
    )


def test_a_wall_clock_step_abandons_nothing(h: InProcessBroker) -> None:
    """Abandonment is an expiry: the wall clock stepping two days ahead (a fixed RTC, NTP
    after a long suspend) ends no job; only unattended time on the monotonic clock does."""
    job_id = _declare(h, conn_id=5)
    h.broker.connection_closed(5)
    _turn(h, 1.0)
    assert _job(h, job_id)["state"] == "stalled"
    h.clock.wall_s += 2 * DAY_S
    _turn(h, 1.0)
    assert _job(h, job_id)["state"] == "stalled"
    _turn(h, DAY_S)
    assert _job(h, job_id)["state"] == "cancelled"

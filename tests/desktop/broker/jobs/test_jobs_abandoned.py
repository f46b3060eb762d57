"""A job declared and left (no worker, no connection, no report) does not show as `stalled`
for ever: after `job_abandon_s` (default 24 h) unattended it ends `cancelled`, reason
`abandoned: …`, and is kept with the finished jobs. On the in-process harness with the
manual clock: nothing runs unless the test runs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rbroker.broker.config import BrokerConfig
from rbroker.broker.jobs import _stalled_at
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


def test_a_restart_goes_on_counting_and_an_abandoned_end_survives_it(
    make_inprocess: Callable[..., InProcessBroker],
) -> None:
    """Within one boot the unattended time goes on across restarts (the stalled job's record
    keeps when it stalled on the boot clock): a broker restarted more often than
    `job_abandon_s` used to count again from each restart and never end the job."""
    h = make_inprocess(SINGLE_24G, job_abandon_s=3600.0)
    left = _declare(h, conn_id=None)
    _turn(h, 1.0)  # stalled from here
    assert _job(h, left)["state"] == "stalled"
    _turn(h, 1200.0)
    h.restart()
    _turn(h, 1200.0)
    h.restart()
    assert _job(h, left)["state"] == "stalled"
    _turn(h, 1199.0)
    assert _job(h, left)["state"] == "stalled"  # 3 599 s unattended
    _turn(h, 1.0)
    assert _job(h, left)["reason"] == "abandoned: no worker, connection or report for 1 h"
    h.restart()
    assert (_job(h, left)["state"], _job(h, left)["reason"]) == (
        "cancelled",
        "abandoned: no worker, connection or report for 1 h",
    )


def test_after_a_reboot_or_a_crash_while_running_the_count_starts_at_the_broker_start(
    make_inprocess: Callable[..., InProcessBroker],
) -> None:
    """Boot-clock readings of another boot do not compare: after a reboot the unattended
    time counts from the broker's start. A job that was running when the broker stopped
    counts from the start too (its workers may have been there until then), and a second
    restart goes on from the first."""
    h = make_inprocess(SINGLE_24G, job_abandon_s=3600.0)
    stalled = _declare(h, conn_id=None)
    running = _declare(h, conn_id=9)  # attached until the broker stops
    _turn(h, 1.0)
    _turn(h, 3000.0)
    assert (_job(h, stalled)["state"], _job(h, running)["state"]) == ("stalled", "queued")
    h.clock.boot_name, h.clock.boot = "since-boot 00000000-test-boot-0002", 30.0  # a reboot
    h.restart()
    _turn(h, 1800.0)
    h.restart()  # the same boot: both go on from the first restart
    _turn(h, 1799.0)
    assert {_job(h, j)["state"] for j in (stalled, running)} == {"stalled"}
    _turn(h, 1.0)
    assert {_job(h, j)["state"] for j in (stalled, running)} == {"cancelled"}


@pytest.mark.parametrize(
    ("mark", "found"),
    [
        ({"clock": "since-boot b1", "boot_s": 40.0}, 40.0),
        ({"clock": "since-boot b1", "boot_s": 0}, 0.0),
        ({"clock": "since-boot b2", "boot_s": 40.0}, None),  # another boot
        ({"clock": "since-boot b1", "boot_s": 500.0}, None),  # ahead of now
        ({"clock": "since-boot b1", "boot_s": -1.0}, None),
        ({"clock": "since-boot b1", "boot_s": True}, None),
        ({"clock": "since-boot b1", "boot_s": "40"}, None),
        ({"clock": "since-boot b1"}, None),
        ("40", None),
        (None, None),
    ],
)
def test_a_stored_stall_mark_counts_only_from_this_boot(mark: Any, found: float | None) -> None:
    assert _stalled_at(mark, "since-boot b1", 100.0) == found
    assert _stalled_at(mark, "", 100.0) is None  # a clock without a boot id: never


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

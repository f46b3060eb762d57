"""Counts of a thousand or more in the broker's refusals are grouped as MiB are
(`rbroker.base.display.fmt_mib`: `1 024`), on the in-process harness."""

from __future__ import annotations

import pytest

from rbroker_protocol.errors import RpcError
from tests.desktop.inprocess import InProcessBroker


def test_a_report_past_the_jobs_total_says_its_numbers_grouped(h: InProcessBroker) -> None:
    job = h.broker.declare_job("alice", "p", "count", "tests.count", 2000, 1, 1)
    h.broker.report_job(job["job_id"], "alice", "c-0", 1500, 20, 1)
    with pytest.raises(RpcError) as refused:
        h.broker.report_job(job["job_id"], "alice", "c-1", 1000, 0, 1)
    assert refused.value.message == (
        "chunk c-1 would bring the job to 2 520 items (1 500 completed + 20 failed + 1 000 now) "
        "but total_items is 2 000"
    )

"""The job SDK (issue 6, architecture.md §6a): `rbroker.job()` ends the job `succeeded` on a normal
exit, `failed` with only the exception's type on an exception, `cancelled` on Ctrl-C;
`Job.report/update/refresh/task`; and a job handle that keeps reporting across a broker
restart without counting anything twice."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import rbroker
from tests.conftest import SINGLE_24G, BrokerProcess, start_broker
from tests.desktop.jobhelp import counts, job_of

pytestmark = pytest.mark.contract  # it starts processes or servers of its own


@pytest.fixture(scope="module")
def broker() -> Iterator[BrokerProcess]:
    """One broker for the module (the restart test starts its own)."""
    bp = start_broker(SINGLE_24G)
    yield bp
    bp.stop(signal.SIGKILL)


SPEC = {
    "project": "tests",
    "purpose": "embed the test corpus",
    "handler": "embed.encode_batch",
}


def test_normal_exit_succeeds(broker: BrokerProcess) -> None:
    with rbroker.job(**SPEC, total_items=50, workers=2, socket=broker.socket) as job:
        assert job.info["state"] == "queued"
        assert job.report("chunk-1", completed=20, failed=1)["state"] == "running"
        again = job.report("chunk-1", completed=20, failed=1)  # a retry: not counted again
        assert counts(again) == (20, 1, 1)
        job.report("chunk-2", completed=29)
        job_id = job.job_id
    with broker.client() as c:
        final = job_of(c, job_id)
    assert final["state"] == "succeeded"
    assert final["reason"] == ""
    assert counts(final) == (49, 1, 2)
    assert final["finished_at"] is not None
    assert (final["project"], final["purpose"], final["handler"], final["workers"]) == (
        "tests",
        "embed the test corpus",
        "embed.encode_batch",
        2,
    )


class SecretError(Exception):
    pass


def test_exception_fails_the_job_with_only_its_type(broker: BrokerProcess) -> None:
    message = "could not open s3://bucket/customer-042.parquet with key AKIA0123"
    with (
        pytest.raises(SecretError, match="customer-042"),
        rbroker.job(**SPEC, total_items=10, socket=broker.socket) as job,
    ):
        job.report("c", completed=3)
        raise SecretError(message)
    with broker.client() as c:
        final = job_of(c, job.job_id)
    assert final["state"] == "failed"
    assert final["reason"] == "raised SecretError"
    assert "customer" not in str(final) and "AKIA" not in str(final)
    assert counts(final) == (3, 0, 1)


def test_ctrl_c_cancels_the_job(broker: BrokerProcess) -> None:
    with pytest.raises(KeyboardInterrupt), rbroker.job(**SPEC, socket=broker.socket) as job:
        raise KeyboardInterrupt
    with broker.client() as c:
        final = job_of(c, job.job_id)
    assert (final["state"], final["reason"]) == ("cancelled", "interrupted")


def test_a_job_ended_inside_the_block_keeps_its_end(broker: BrokerProcess) -> None:
    with rbroker.job(**SPEC, socket=broker.socket) as job:
        job.report("c", completed=1)
        job.update("cancelled", reason="operator stopped it")
        with pytest.raises(rbroker.JobFinished):
            job.report("d", completed=1)
    with broker.client() as c:
        final = job_of(c, job.job_id)
    assert (final["state"], final["reason"]) == ("cancelled", "operator stopped it")
    assert counts(final) == (1, 0, 1)


def test_a_job_ended_from_elsewhere_keeps_that_end_on_normal_exit(broker: BrokerProcess) -> None:
    with rbroker.job(**SPEC, socket=broker.socket) as job:
        job.report("c", completed=1)
        with broker.client() as other:  # e.g. an operator's tool, same OS user
            other.call("job.update", job_id=job.job_id, state="cancelled", reason="operator")
    with broker.client() as c:  # the block's normal exit raised nothing
        final = job_of(c, job.job_id)
    assert (final["state"], final["reason"]) == ("cancelled", "operator")


def test_update_workers_and_refresh_see_other_reporters(broker: BrokerProcess) -> None:
    with rbroker.job(**SPEC, total_items=100, workers=1, socket=broker.socket) as job:
        assert job.update(workers=4)["workers"] == 4
        with broker.client() as other:  # another process's report
            other.call("job.report", job_id=job.job_id, chunk_id="x", completed=7)
        assert counts(job.refresh()) == (7, 0, 1)
        assert counts(job.info) == (7, 0, 1)


def test_sdk_errors_are_typed(broker: BrokerProcess, short_dir: Path) -> None:
    with rbroker.job(**SPEC, total_items=10, socket=broker.socket) as job:
        job.report("a", completed=5)
        with pytest.raises(rbroker.InvalidParams):
            job.report("b", completed=6)  # beyond total_items
        with pytest.raises(rbroker.InvalidParams):
            job.report("a", completed=4)  # the same chunk with other counts
        with pytest.raises(rbroker.InvalidParams):
            job.report("c", completed=-1)
        with pytest.raises(rbroker.InvalidParams):
            job.update("failed")  # no reason
        assert counts(job.refresh()) == (5, 0, 1)
    with (
        pytest.raises(rbroker.DescriptionRejected),
        rbroker.job(
            project="tests",
            purpose="mail results to someone@example.com",
            handler="x.y",
            socket=broker.socket,
        ),
    ):
        pass  # pragma: no cover
    with broker.client() as c:
        assert all("example.com" not in j["purpose"] for j in c.call("jobs.list")["jobs"])
    with (
        pytest.raises(rbroker.BrokerUnavailable),
        rbroker.job(**SPEC, socket=str(short_dir / "none.sock")),
    ):
        pass  # pragma: no cover


def _fails_on_negative(items: list[int]) -> tuple[int, int] | None:
    if min(items) < 0:
        raise ValueError("item -1 is broken")
    if 0 in items:
        return None  # all completed
    return len(items) - 1, 1


def test_chunk_task_reports_completed_failed_and_raised_chunks(broker: BrokerProcess) -> None:
    with rbroker.job(**SPEC, total_items=30, socket=broker.socket) as job:
        task = job.task(_fails_on_negative)  # no mib: no lease, report only
        assert task("c0", list(range(0, 10))) is None
        assert task("c1", list(range(10, 20))) == (9, 1)
        with pytest.raises(ValueError, match="item -1"):
            task("c2", [-1] * 10)  # raised: every item of the chunk failed
        assert counts(job.refresh()) == (19, 11, 3)


def test_chunk_task_keeps_the_callers_exception_when_its_report_is_refused(
    broker: BrokerProcess,
) -> None:
    with rbroker.job(**SPEC, total_items=30, socket=broker.socket) as job:
        task = job.task(_fails_on_negative)
        job.update("cancelled", reason="stopped early")
        with pytest.raises(ValueError, match="item -1") as err:
            task("c0", [-1] * 10)  # its failure report is refused: the job has ended
        assert any("not reported" in note for note in err.value.__notes__)
        assert counts(job.refresh()) == (0, 0, 0)


def test_a_task_run_in_the_declaring_process_lets_its_lease_go_when_the_job_ends(
    broker: BrokerProcess,
) -> None:
    """Before: `job.task(fn, mib=...)` run in the declaring process itself (here from a
    thread pool) kept its lease, its heartbeats and its connection after the job's block
    ended, for as long as the process lived (the socket was reported unclosed at exit).
    Right: the block's end releases that lease and closes that connection."""
    with rbroker.job(**SPEC, total_items=20, socket=broker.socket) as job:
        task = job.task(_fails_on_negative, mib=1024)
        with ThreadPoolExecutor(2) as pool:
            chunks = pool.map(task, ["c0", "c1"], [[1] * 10, [2] * 10])
            assert list(chunks) == [(9, 1), (9, 1)]
        with broker.client() as c:
            (held,) = [x for x in c.leases()["leases"] if x["job_id"] == job.job_id]
        assert held["granted_mib"] == 1024  # one lease for the process, whichever thread
    with broker.client() as c:
        seen = c.leases(include_ended=True)
        assert [x for x in seen["leases"] if x["job_id"] == job.job_id] == []
        (ended,) = [x for x in seen["ended"] if x["lease_id"] == held["lease_id"]]
        assert (ended["state"], ended["ended_reason"]) == ("released", "released by holder")
        assert job_of(c, job.job_id)["state"] == "succeeded"


def test_job_handle_keeps_reporting_across_a_broker_restart(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    bp = broker_factory()
    root = bp.data_dir.parent
    with rbroker.job(**SPEC, total_items=40, socket=bp.socket) as job:
        job.report("c1", completed=10)
        job.report("c2", completed=9, failed=1)
        bp.stop(signal.SIGKILL)
        bp2 = broker_factory(root=root)
        # the declarer re-sends c2 (its answer may have been lost) and goes on
        assert counts(job.report("c2", completed=9, failed=1)) == (19, 1, 2)
        with bp2.client() as c:
            assert job_of(c, job.job_id)["state"] == "stalled"  # a duplicate is no progress
        after = job.report("c3", completed=10)
        assert after["state"] == "running"
        assert counts(after) == (29, 1, 3)
    with bp2.client() as c:
        final = job_of(c, job.job_id)
    assert final["state"] == "succeeded"
    assert counts(final) == (29, 1, 3)

"""Bad input to the job methods (issue 6): each is a clear error with a stable name and
the numbers, and leaves the job's counts, chunks and state exactly as they were."""

from __future__ import annotations

import os
import pwd
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rbroker
from tests.conftest import SINGLE_24G, BrokerProcess, start_broker
from tests.desktop.jobhelp import declare, job_of

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

TOTAL = 100
SECRET = "ghp_" + "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI3kM5"  # a GitHub token's shape


@pytest.fixture(scope="module")
def broker() -> Iterator[BrokerProcess]:
    """One broker for the module; every test checks that it is still alive."""
    bp = start_broker(SINGLE_24G)
    yield bp
    bp.stop(signal.SIGKILL)


@pytest.fixture
def client(broker: BrokerProcess) -> Iterator[rbroker.Client]:
    with broker.client() as c:
        yield c
    assert broker.proc.poll() is None


@pytest.fixture
def job(client: rbroker.Client) -> dict[str, Any]:
    """A running job of TOTAL items with one chunk (10 completed, 2 failed) counted."""
    job = declare(client, total_items=TOTAL)
    client.call("job.report", job_id=job["job_id"], chunk_id="c-0", completed=10, failed=2)
    return job_of(client, job["job_id"])


def _snapshot(job: dict[str, Any]) -> tuple[Any, ...]:
    keys = ("state", "reason", "completed_items", "failed_items", "chunks_reported", "workers")
    return tuple(job[k] for k in keys)


def _refused(client: rbroker.Client, code: str, method: str, **params: Any) -> str:
    with pytest.raises(rbroker.RBrokerError) as err:
        client.call(method, **params)
    assert err.value.code == code, err.value  # type: ignore[attr-defined]
    return str(err.value)


@pytest.mark.parametrize(
    ("completed", "failed"),
    [(-1, 0), (0, -5), (-3, 4), (1.5, 0), ("3", 0), (True, 0), (None, 1), (10**13, 0)],
)
def test_bad_counts_are_refused(
    client: rbroker.Client, job: dict[str, Any], completed: Any, failed: Any
) -> None:
    msg = _refused(
        client,
        "invalid_params",
        "job.report",
        job_id=job["job_id"],
        chunk_id="c-bad",
        completed=completed,
        failed=failed,
    )
    assert "completed" in msg or "failed" in msg
    assert _snapshot(job_of(client, job["job_id"])) == _snapshot(job)


def test_zero_counts_are_refused(client: rbroker.Client, job: dict[str, Any]) -> None:
    msg = _refused(
        client, "invalid_params", "job.report", job_id=job["job_id"], chunk_id="c-z", completed=0
    )
    assert "completed + failed > 0" in msg
    assert _snapshot(job_of(client, job["job_id"])) == _snapshot(job)


def test_beyond_total_items_is_refused_with_the_numbers(
    client: rbroker.Client, job: dict[str, Any]
) -> None:
    msg = _refused(
        client,
        "invalid_params",
        "job.report",
        job_id=job["job_id"],
        chunk_id="c-over",
        completed=80,
        failed=9,
    )
    assert "101" in msg and "total_items is 100" in msg
    assert _snapshot(job_of(client, job["job_id"])) == _snapshot(job)
    # the refused chunk id was not taken: exactly up to total_items is fine
    ok = client.call("job.report", job_id=job["job_id"], chunk_id="c-over", completed=80, failed=8)
    assert ok["duplicate"] is False
    assert ok["job"]["completed_items"] + ok["job"]["failed_items"] == TOTAL


def test_chunk_id_reused_with_other_counts_is_refused(
    client: rbroker.Client, job: dict[str, Any]
) -> None:
    msg = _refused(
        client, "invalid_params", "job.report", job_id=job["job_id"], chunk_id="c-0", completed=11
    )
    assert "completed=10, failed=2" in msg
    again = client.call("job.report", job_id=job["job_id"], chunk_id="c-0", completed=10, failed=2)
    assert again["duplicate"] is True
    assert _snapshot(job_of(client, job["job_id"])) == _snapshot(job)


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("job.report", {"chunk_id": "c-1", "completed": 1}),
        ("job.update", {"state": "succeeded"}),
        ("job.update", {"workers": 3}),
    ],
)
def test_unknown_job_id(client: rbroker.Client, method: str, params: dict[str, Any]) -> None:
    msg = _refused(client, "job_not_found", method, job_id="job-000000000000", **params)
    assert "job-000000000000" in msg
    assert all(j["job_id"] != "job-000000000000" for j in client.call("jobs.list")["jobs"])


def test_lease_for_an_unknown_job_is_refused(client: rbroker.Client) -> None:
    _refused(
        client,
        "job_not_found",
        "lease.acquire",
        mib=512,
        project="tests",
        session="s",
        purpose="worker",
        job_id="job-000000000000",
    )
    assert client.call("leases.list")["leases"] == []


@pytest.mark.parametrize("end", ["succeeded", "failed", "cancelled"])
def test_finished_job_refuses_reports_and_updates(
    client: rbroker.Client, job: dict[str, Any], end: str
) -> None:
    job_id = job["job_id"]
    done = client.call("job.update", job_id=job_id, state=end, reason="stopped by the test")
    assert done["job"]["state"] == end and done["job"]["finished_at"] is not None
    before = _snapshot(job_of(client, job_id))
    msg = _refused(client, "job_finished", "job.report", job_id=job_id, chunk_id="c-9", completed=1)
    assert end in msg
    for params in ({"state": "running"}, {"state": "succeeded"}, {"workers": 2}):
        _refused(client, "job_finished", "job.update", job_id=job_id, **params)
    _refused(client, "job_finished", "job.update", job_id=job_id, state="failed", reason="again")
    # no new worker lease for it either
    _refused(
        client,
        "job_finished",
        "lease.acquire",
        mib=512,
        project="tests",
        session="s",
        purpose="late worker",
        job_id=job_id,
    )
    assert client.call("leases.list")["leases"] == []
    # a chunk counted before the end, re-sent (its answer was lost), is acknowledged
    again = client.call("job.report", job_id=job_id, chunk_id="c-0", completed=10, failed=2)
    assert again["duplicate"] is True
    assert _snapshot(job_of(client, job_id)) == before


@pytest.mark.parametrize("end", ["failed", "cancelled"])
@pytest.mark.parametrize("reason", [None, "", "   "])
def test_failed_and_cancelled_need_a_reason(
    client: rbroker.Client, job: dict[str, Any], end: str, reason: str | None
) -> None:
    params: dict[str, Any] = {"state": end}
    if reason is not None:
        params["reason"] = reason
    with pytest.raises(rbroker.RBrokerError) as err:
        client.call("job.update", job_id=job["job_id"], **params)
    # no reason: invalid_params; an empty one breaks the description rule `empty`
    want = "invalid_params" if reason is None else "description_rejected"
    assert err.value.code == want, err.value  # type: ignore[attr-defined]
    assert "reason" in str(err.value)
    assert _snapshot(job_of(client, job["job_id"])) == _snapshot(job)


@pytest.mark.parametrize("state", ["stalled", "queued", "done", "RUNNING", ""])
def test_states_a_client_may_not_set(
    client: rbroker.Client, job: dict[str, Any], state: str
) -> None:
    _refused(client, "invalid_params", "job.update", job_id=job["job_id"], state=state)
    assert _snapshot(job_of(client, job["job_id"])) == _snapshot(job)


@pytest.mark.parametrize("field", ["project", "purpose", "handler"])
def test_declare_with_a_secret_is_rejected_without_echo(client: rbroker.Client, field: str) -> None:
    before = len(client.call("jobs.list")["jobs"])
    params = {
        "project": "tests",
        "purpose": "count chunks",
        "handler": "tests.count",
        field: f"embed with {SECRET}",
    }
    msg = _refused(client, "description_rejected", "job.declare", **params)
    assert SECRET not in msg and SECRET[4:] not in msg
    assert field in msg
    assert len(client.call("jobs.list")["jobs"]) == before


def test_reason_with_a_secret_is_rejected_without_echo(
    client: rbroker.Client, job: dict[str, Any]
) -> None:
    msg = _refused(
        client,
        "description_rejected",
        "job.update",
        job_id=job["job_id"],
        state="failed",
        reason=f"token {SECRET} expired",
    )
    assert SECRET not in msg and SECRET[4:] not in msg
    assert _snapshot(job_of(client, job["job_id"])) == _snapshot(job)


@pytest.mark.parametrize(
    "params",
    [
        {"workers": 0},
        {"workers": -2},
        {"total_items": -1},
        {"total_items": 2.5},
        {"handler": None},
        {"command_line": "python train.py"},
        {"project": ""},
        {"purpose": "x" * 10_000},
    ],
)
def test_bad_declarations_are_refused(client: rbroker.Client, params: dict[str, Any]) -> None:
    before = len(client.call("jobs.list")["jobs"])
    full: dict[str, Any] = {"project": "tests", "purpose": "count", "handler": "tests.count"}
    full.update(params)
    with pytest.raises(rbroker.RBrokerError) as err:
        client.call("job.declare", **{k: v for k, v in full.items() if v is not None})
    assert err.value.code in ("invalid_params", "description_rejected")  # type: ignore[attr-defined]
    assert len(client.call("jobs.list")["jobs"]) == before


def _as_user(uid: int, gid: int, socket: str, job_id: str) -> list[str]:
    """In a forked child that switched to `uid`: try to report to and change `job_id`;
    the error code (or `accepted`) of each attempt."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            out = []
            with rbroker.Client(socket) as c:
                for method, params in (
                    ("job.report", {"chunk_id": "not-mine", "completed": 1}),
                    ("job.update", {"state": "cancelled", "reason": "not mine"}),
                    ("job.update", {"workers": 7}),
                    ("lease.acquire", {"mib": 512, "project": "x", "session": "x", "purpose": "x"}),
                ):
                    try:
                        c.call(method, job_id=job_id, **params)
                        out.append("accepted")
                    except rbroker.RBrokerError as exc:
                        out.append(str(exc.code))
            os.write(write_fd, " ".join(out).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as r:
        data = r.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return data.split()


def test_another_users_job_cannot_be_reported_or_changed(
    broker: BrokerProcess, client: rbroker.Client, job: dict[str, Any]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to act as a second OS user")
    nobody = pwd.getpwnam("nobody")
    os.chmod(Path(broker.socket).parent, 0o755)
    os.chmod(broker.socket, 0o666)
    codes = _as_user(nobody.pw_uid, nobody.pw_gid, broker.socket, job["job_id"])
    assert codes == ["not_job_owner"] * 4
    assert _snapshot(job_of(client, job["job_id"])) == _snapshot(job)

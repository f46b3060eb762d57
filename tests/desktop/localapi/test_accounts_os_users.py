"""A job belongs to the OS account that declared it, not to its name: with real OS users on
a broker process, an account removed and re-created under the same name (another uid) can
neither change nor report to the old account's job, which every view still shows under the
name. The rule itself: tests/desktop/broker/jobs/test_jobs_bounds.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import rbroker
from tests.conftest import SINGLE_24G, BrokerProcess
from tests.os_users import OsUser, create_user, open_to_everyone, recreate_user, remove_user, run_as

pytestmark = pytest.mark.contract  # it starts processes or servers of its own


def _declare(socket: str) -> str:
    with rbroker.Client(socket) as c:
        job = c.call("job.declare", project="p", purpose="embed", handler="x.y", total_items=4)
        return str(job["job"]["job_id"])


def _change(socket: str, job_id: str) -> tuple[str, str]:
    """Try to report a chunk and then to cancel `job_id`: (code, message) of the first
    refusal, or ("done", state)."""
    try:
        with rbroker.Client(socket) as c:
            c.call("job.report", job_id=job_id, chunk_id="c-1", completed=1, failed=0)
            state = c.call("job.update", job_id=job_id, state="cancelled", reason="mine now")
            return "done", str(state["job"]["state"])
    except rbroker.RBrokerError as exc:
        return exc.code, exc.message


def _owners(socket: str) -> list[Any]:
    with rbroker.Client(socket) as c:
        jobs = c.call("jobs.list")["jobs"]
        return [(j["job_id"], j["owner"], j["state"], j["completed_items"]) for j in jobs]


def test_a_re_created_account_does_not_take_over_the_old_one_s_jobs(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    import os
    import shutil
    import sys

    if sys.platform == "win32" or os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to create and re-create an OS user")
    bp = broker_factory(SINGLE_24G)
    open_to_everyone(Path(bp.socket).parent, bp.socket)
    user: OsUser = create_user()
    try:
        job_id = run_as(user, _declare, bp.socket)
        newcomer = recreate_user(user)
        assert newcomer.name == user.name and newcomer.uid != user.uid
        user = newcomer
        code, message = run_as(user, _change, bp.socket, job_id)
        assert code == "not_job_owner", message
        assert f"another account named {user.name}" in message and "\n" not in message
        # still shown under the name, untouched: no item counted, not cancelled
        [old] = [j for j in _owners(bp.socket) if j[0] == job_id]
        assert old[1] == user.name and old[2] in ("queued", "running", "stalled"), old
        assert old[3] == 0, old  # (queued until the broker has seen its connection close)
        # a job the newcomer declares is its own
        own = run_as(user, _declare, bp.socket)
        assert run_as(user, _change, bp.socket, own) == ("done", "cancelled")
    finally:
        remove_user(user)

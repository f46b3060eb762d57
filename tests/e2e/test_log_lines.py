"""Log lines a user reads: no HTTP client line per report at `-v`, no migration chatter
when the coordinator starts (real broker and coordinator processes, their real logs)."""

from __future__ import annotations

import signal
import time

from tests.conftest import SINGLE_24G, short_tmp, start_broker, wait_until
from tests.e2e.conftest import CoordinatorProcess, enroll_cli


def test_verbose_broker_logs_no_http_client_line_per_report(
    shared_coordinator: CoordinatorProcess,
) -> None:
    c = shared_coordinator
    root = short_tmp()
    done = enroll_cli(c.url, c.new_code(), root / "data", "lab-verbose", "--key-file")
    assert done.returncode == 0, done.stderr
    bp = start_broker(SINGLE_24G, root=root, extra_args=["-v"])
    try:
        with bp.client() as client:
            lease = client.call("lease.acquire", mib=1024, project="p", session="s", purpose="x")
            wait_until(lambda: client.status()["coordinator"]["link"] == "ok", timeout_s=20)
            client.call("lease.release", lease_id=lease["lease"]["lease_id"])
            first = client.status()["coordinator"]["last_report_at"]
            wait_until(
                lambda: client.status()["coordinator"]["last_report_at"] != first, timeout_s=20
            )
        time.sleep(0.2)
        log = bp.log()
        assert "reporting to" in log, log  # -v is on: INFO lines are there
        assert "HTTP Request" not in log and "httpx" not in log, log
    finally:
        bp.stop(signal.SIGKILL)


def test_coordinator_start_has_no_migration_chatter(
    shared_coordinator: CoordinatorProcess,
) -> None:
    log = shared_coordinator.log_path.read_text()
    assert "alembic" not in log, log
    assert "database schema at revision" in log  # the one line that says where the schema is

"""Over-grant noticed (docs/architecture.md §2): a lease whose observed memory stays above its
grant longer than the grace gets one `over_grant` event per episode, with the numbers; the
holder's SDK turns it into an `OverGrantWarning` (an error where a filter says so);
`rbroker status` marks the lease and the report to the coordinator carries the flag.
Nothing is killed or throttled: the lease stays active throughout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rbroker.broker.config import BrokerConfig
from rbroker.uplink.payload import build_payload
from rbroker_protocol.reports import ReportPayload
from tests.conftest import GPU0, WORKER, BrokerProcess
from tests.desktop.inprocess import InProcessBroker, SleeperPool
from tests.fakes.gpu_scenarios import gpu, scenario

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

SCENARIO = scenario(gpu(GPU0))


@pytest.fixture
def h(make_inprocess: Callable[..., InProcessBroker]) -> InProcessBroker:
    return make_inprocess(SCENARIO)


def test_default_grace_is_ten_seconds(tmp_path: Path) -> None:
    assert BrokerConfig(socket_path=tmp_path / "s", data_dir=tmp_path).over_grant_grace_s == 10.0
    with pytest.raises(ValueError, match="over-grant grace must be 0 seconds or more"):
        BrokerConfig(socket_path=tmp_path / "s", data_dir=tmp_path, over_grant_grace_s=-1)


def test_one_event_per_episode_after_the_grace(h: InProcessBroker) -> None:
    pool = SleeperPool()
    try:
        events: list[dict[str, Any]] = []
        h.broker.subscribe(lambda kind, data: events.append(data) if kind == "over_grant" else None)
        proc, holder = pool.spawn()
        task = h.acquire(holder, mib=4096)
        h.sample()
        lease = task.result()

        def use(mib: int | None) -> None:
            h.fake.free(GPU0, proc.pid)
            if mib:
                h.fake.allocate(GPU0, proc.pid, mib)
            h.sample()

        use(6000)  # 1 904 MiB over: the episode starts, not reported yet
        assert lease.over_grant and lease.over_mib == 1904 and events == []
        h.clock.advance(9.9)
        h.sample()
        assert events == []  # 9.9 s < the 10 s grace
        h.clock.advance(0.2)
        h.sample()
        assert len(events) == 1
        event = events[0]
        assert event["lease_id"] == lease.lease_id and event["gpu_uuid"] == GPU0
        assert event["granted_mib"] == 4096 and event["observed_mib"] == 6000
        assert event["over_mib"] == 1904 and event["over_s"] >= 10.0
        assert (event["owner"], event["project"], event["session"]) == (
            "tester",
            "tests",
            "in-process",
        )
        assert "pid" not in json.dumps(event)
        for _ in range(5):  # the same episode: never again
            h.clock.advance(5)
            h.sample()
        assert len(events) == 1
        wire = h.broker.leases_view()["leases"][0]
        assert wire["over_grant"] and wire["over_grant_noticed"]
        assert wire["over_grant_mib"] == 1904 and wire["state"] == "active"
        use(3000)  # inside the grant: the episode ends
        assert not lease.over_grant and lease.over_mib == 0 and not lease.over_noticed
        use(5000)  # a new episode: reported again after its own grace
        h.clock.advance(5)
        h.sample()
        assert len(events) == 1
        h.clock.advance(5.1)
        h.sample()
        assert len(events) == 2 and events[1]["over_mib"] == 904
        assert lease.lease_id in h.broker.leases  # warn only: never ended
        payload = ReportPayload.model_validate_json(build_payload(h.broker, "pc", "run-1")[0])
        assert [x.over_grant for x in payload.leases] == [True]
    finally:
        pool.close()


def _holder(broker: BrokerProcess, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(WORKER / "over_grant_holder.py"), broker.socket, "4096", "6000", mode],
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_holder_gets_one_over_grant_warning(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory(extra_args=["--over-grant-grace", "1"])
    done = _holder(broker, "warn")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[0])
    event = out["event"]
    assert event["granted_mib"] == 4096 and event["observed_mib"] == 6000
    assert event["over_mib"] == 1904 and event["over_s"] >= 1.0
    assert len(out["warnings"]) == 1, out["warnings"]  # 3 s more over its grant: still one
    message = out["warnings"][0]
    assert message.startswith(f"lease {event['lease_id']} uses 1 904 MiB more than its grant")
    assert "4 096 MiB" in message and "observed 6 000 MiB" in message
    (listed,) = out["listed"]
    assert listed["over_grant_noticed"] and listed["state"] == "active"


def test_over_grant_warning_made_an_error_raises_in_check(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory(extra_args=["--over-grant-grace", "0.5"])
    done = _holder(broker, "error")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("raised lease ") and "1 904 MiB more than its grant" in lines[0]
    assert lines[1] == "done"  # the `with` block's end did not raise it a second time


def test_rbroker_status_marks_a_lease_over_its_grant(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory(extra_args=["--over-grant-grace", "0.5"])
    holder = subprocess.Popen(
        [sys.executable, str(WORKER / "over_grant_holder.py"), broker.socket, "4096", "6000",
         "warn"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            with broker.client() as c:
                leases = c.leases()["leases"]
            if leases and leases[0]["over_grant_noticed"]:
                break
            assert time.monotonic() < deadline, leases
            time.sleep(0.1)
        status = subprocess.run(
            [sys.executable, "-m", "rbroker", "status", "--socket", broker.socket],
            capture_output=True, text=True, timeout=30, env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        assert re.search(r"6 ?000 \(\+1 ?904 over\)", status.stdout), status.stdout
    finally:
        holder.kill()
        holder.wait(10)
        for stream in (holder.stdout, holder.stderr):
            if stream is not None:
                stream.close()

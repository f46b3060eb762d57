"""A coordinator outage of 60 s while leases are granted and released (over HTTPS with a
self-signed coordinator, its CA pinned at enrollment). Run at half that time scale: a 30 s
outage with reports every 2.5 s (`report_interval_s` in the broker's uplink.json, default
5 s) and a coordinator that calls a computer stale after 3 report intervals; the uplink's
retry backoff is a share of the report interval, so every ratio stays.

Local leasing is unaffected; the link state says `retrying since …`; a second coordinator
process on the same database shows the computer stale with its last known values; once the
coordinator is back, its fleet shows the current state within one report interval.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import short_tmp, wait_until
from tests.e2e.conftest import (
    CoordinatorProcess,
    UplinkBroker,
    Worker,
    by_name,
    enroll_cli,
    rbroker_cli,
)

SCALE = 0.5
OUTAGE_S = 60.0 * SCALE
REPORT_INTERVAL_S = 5.0 * SCALE


def _sessions(computer: dict[str, Any]) -> set[str]:
    return {lease["session"] for lease in computer["leases"]}


@pytest.mark.slow
def test_coordinator_outage(
    coordinator_factory: Callable[..., CoordinatorProcess],
    uplink_broker: Callable[..., UplinkBroker],
    lease_worker: Callable[..., Worker],
) -> None:
    coordinator = coordinator_factory(tls=True, stale_after_s=3 * REPORT_INTERVAL_S)
    assert coordinator.url.startswith("https://")
    # without the coordinator's CA the certificate is not trusted: nothing is enrolled
    done = enroll_cli(coordinator.url, coordinator.first_code, short_tmp() / "d", "x", "--key-file")
    err = " ".join(done.stderr.split())
    assert done.returncode == 1 and "cannot reach the coordinator" in err, err
    assert "CERTIFICATE_VERIFY_FAILED" in err, err
    done = enroll_cli(
        coordinator.url, coordinator.first_code, short_tmp() / "d", "x", "--key-file",
        "--ca-file", "/nonexistent/ca.pem",
    )  # fmt: skip
    assert done.returncode == 1 and "cannot use the CA file" in done.stderr, done.stderr
    # enrolled with --ca-file
    lab = uplink_broker(coordinator, "lab-out", report_interval_s=REPORT_INTERVAL_S)
    before = lease_worker(lab.broker, 4096, "vision", "before-outage", "train before")
    wait_until(
        lambda: _sessions(by_name(coordinator.fleet())["lab-out"]) == {"before-outage"},
        timeout_s=20,
        interval_s=0.2,
    )
    done = rbroker_cli("fleet", "--data-dir", str(lab.broker.data_dir), "--json")  # over TLS
    assert done.returncode == 0, done.stderr
    assert [c["name"] for c in json.loads(done.stdout)["computers"]] == ["lab-out"]
    reader = coordinator.second()  # same database, its own port
    try:
        coordinator.stop()
        down_at = time.monotonic()

        # local leasing goes on: grant and release, each answered at once
        during = lease_worker(lab.broker, 2048, "vision", "during-outage", "train during")
        before.stop()
        cycles = []
        with lab.broker.client() as c:
            for i in range(20):
                t = time.monotonic()
                got = c.call(
                    "lease.acquire", mib=512, project="t", session=f"cycle-{i}", purpose="p"
                )
                c.call("lease.release", lease_id=got["lease"]["lease_id"])
                cycles.append(time.monotonic() - t)
            active = {x["session"] for x in c.leases()["leases"]}
        assert active == {"during-outage"}
        slowest = max(cycles)
        print(f"outage: 20 lease cycles, slowest {slowest * 1000:.0f} ms")
        assert slowest < 1.0

        link = wait_until(
            lambda: lab.link()["link"].startswith("retrying since ") and lab.link(), timeout_s=15
        )
        assert isinstance(link, dict) and link["detail"], link

        # the other coordinator process: stale, with the last known values
        def stale() -> dict[str, Any] | None:
            c = by_name(reader.fleet())["lab-out"]
            return c if c["freshness"]["state"] == "stale" else None

        seen = wait_until(stale, timeout_s=3 * REPORT_INTERVAL_S + 10, interval_s=0.5)
        assert isinstance(seen, dict)
        print(f"outage: second coordinator shows {seen['freshness']['text']!r}")
        assert seen["freshness"]["text"].startswith("last known, ")
        assert _sessions(seen) == {"before-outage"}
        assert seen["gpus"][0]["leases"] == 1 and seen["gpus"][0]["total_mib"] == 24576
        assert lab.link()["link"].startswith("retrying since ")

        time.sleep(max(0.0, down_at + OUTAGE_S - time.monotonic()))
        coordinator.start()
        up_at = time.monotonic()

        def current() -> bool:
            c = by_name(coordinator.fleet())["lab-out"]
            return c["freshness"]["state"] == "online" and _sessions(c) == {"during-outage"}

        wait_until(current, timeout_s=30, interval_s=0.1)
        took = time.monotonic() - up_at
        print(f"outage: current state shown {took:.1f} s after the coordinator answered again")
        assert took <= REPORT_INTERVAL_S
        assert lab.link()["link"] == "ok"
        assert by_name(reader.fleet())["lab-out"]["freshness"]["state"] == "online"
        log = lab.broker.log()
        assert log.count("coordinator unreachable") == 1, log  # one line when it goes away
        assert log.count("coordinator reachable again") == 1, log  # and one when it is back
        during.stop()
    finally:
        reader.stop()

"""A revoked computer's broker says so once and backs off: one ERROR line per refusal,
no retry per state change, and the link state (`broker.status`, `rbroker status`) says
since when and when the next try is (real coordinator and broker processes, their logs;
a small real TCP proxy between them counts the tries); and the backoff of a refusal that
repeats, tried against a small real HTTP server that refuses every report."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import nacl.signing
import pytest

from rbroker.uplink.config import UplinkConfig
from rbroker.uplink.reporter import REJECTED_PAUSE_S, Reporter
from tests.conftest import SINGLE_24G, wait_until
from tests.desktop.inprocess import InProcessBroker
from tests.e2e.conftest import CoordinatorProcess, UplinkBroker, rbroker_cli, server_cli
from tests.e2e.test_uplink_delivery import DropProxy
from tests.fakes.coordinator import Answer, FakeCoordinator

ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def _epoch(iso: str) -> float:
    return time.mktime(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone


@pytest.fixture
def proxy(coordinator: CoordinatorProcess) -> Iterator[DropProxy]:
    p = DropProxy(("127.0.0.1", coordinator.port))
    yield p
    p.close()


def test_revoked_computer_is_said_once_and_backs_off(
    coordinator: CoordinatorProcess,
    proxy: DropProxy,
    uplink_broker: Callable[..., UplinkBroker],
) -> None:
    c = coordinator
    # reports every 2.5 s (default 5 s): the window below spans 2.4 report intervals, as
    # 12 s did at the default
    b = uplink_broker(c, "lab-revoked", url=proxy.start(), report_interval_s=2.5)
    wait_until(lambda: b.link()["link"] == "ok", timeout_s=20)
    done = server_cli("computer", "revoke", b.computer_id, "--data-dir", str(c.data_dir))
    assert done.returncode == 0, done.stderr

    refused_at = time.time()
    with b.broker.client() as client:
        wait_until(lambda: client.status()["coordinator"]["link"].startswith("rejected"), 20)
        first = client.status()["coordinator"]
        # the reported state changes every 0.5 s: a revoked computer is not retried on it
        until = time.monotonic() + 6
        while time.monotonic() < until:
            lease = client.call("lease.acquire", mib=1024, project="p", session="s", purpose="x")
            time.sleep(0.25)
            client.call("lease.release", lease_id=lease["lease"]["lease_id"])
            time.sleep(0.25)
        link = client.status()["coordinator"]

    m = re.fullmatch(
        rf"rejected: 403 computer revoked \(since ({ISO}), next try ({ISO})\)", link["link"]
    )
    assert m is not None, link
    assert link == first, (first, link)  # one try: the link is the first refusal's
    assert link["detail"] == "computer revoked"
    since, next_try = (_epoch(t) for t in m.groups())
    assert refused_at - 2 <= since <= time.time()
    assert next_try - since == REJECTED_PAUSE_S == 60.0

    log = b.broker.log()
    lines = [line for line in log.splitlines() if "rejected the report" in line]
    assert len(lines) == 1, log
    assert "ERROR" in lines[0] and "403 computer revoked" in lines[0], lines
    assert "next try in 60 s" in lines[0], lines
    refused = [s for s in proxy.reports() if b'"status_code":403' in s.answer]
    assert len(refused) == 1, [s.answer for s in proxy.reports()]

    # `rbroker status` prints the link state, in words and as JSON
    done = rbroker_cli("status", "--socket", b.broker.socket)
    assert done.returncode == 0, done.stderr
    assert f"coordinator: {link['link']}" in done.stdout, done.stdout
    done = rbroker_cli("status", "--socket", b.broker.socket, "--json")
    assert json.loads(done.stdout)["status"]["coordinator"]["link"] == link["link"]


@pytest.mark.parametrize(
    ("status", "pauses"),
    [
        # a refusal of the computer: only the timer, 60 s doubling up to 900 s
        (403, [(60, 60), (120, 120), (240, 240), (480, 480), (900, 900), (900, 900)]),
        (401, [(60, 60), (120, 120)]),
        # a refusal of the report: a changed one after 1 s doubling up to 60 s, else the timer
        (400, [(1, 60), (2, 120), (4, 240), (8, 480), (16, 900), (32, 900), (60, 900)]),
        (413, [(1, 60), (2, 120)]),
    ],
)
def test_a_repeated_refusal_backs_off_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, status: int, pauses: list[tuple[int, int]]
) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SINGLE_24G)
    h = InProcessBroker(scenario, tmp_path, persist=False)
    detail = f"planted reason for {status}"
    fake = FakeCoordinator(then=Answer(status, detail=detail))
    url = fake.start()
    config = UplinkConfig(url=url, computer_id="c_refused", group="g", name="lab-refused")
    reporter = Reporter(h.broker, config, nacl.signing.SigningKey.generate())

    async def tries(n: int) -> list[tuple[str, tuple[float, float], str]]:
        async with httpx.AsyncClient(base_url=url) as client:
            out = []
            for _ in range(n):
                outcome = await reporter._send(client, b"{}")
                out.append((outcome, reporter.rejected_pause_s, reporter.link))
            return out

    try:
        with caplog.at_level(logging.DEBUG, logger="rbroker.uplink.reporter"):
            seen = h.run(tries(len(pauses)))
            assert [s[0] for s in seen] == ["rejected"] * len(pauses)
            assert [s[1] for s in seen] == pauses
            when = "next try" if status in (401, 403) else "next try on a change, at the latest"
            for _, (_, longest), link in seen:
                m = re.fullmatch(
                    rf"rejected: {status} {detail} \(since ({ISO}), {when} ({ISO})\)", link
                )
                assert m is not None, link
                assert abs(_epoch(m.group(2)) - _epoch(m.group(1)) - longest) <= 2, link
            errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(errors) == 1, [r.getMessage() for r in errors]
            assert f"rejected the report: {status} {detail}" in errors[0].getMessage()

            # another refusal is a new episode: said once more, its backoff from the start
            fake.then = Answer(422, detail="planted reason for 422")
            caplog.clear()
            assert h.run(tries(2))[1][:2] == ("rejected", (2, 120))
            assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1

            # accepted again: said once, and the next refusal starts over
            fake.then = Answer(200)
            caplog.clear()
            assert h.run(tries(1))[0][0] == "ok" and reporter.link == "ok"
            warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(warned) == 1 and "reachable again" in warned[0], warned
            fake.then = Answer(status, detail=detail)
            assert h.run(tries(1))[0][1] == pauses[0]
    finally:
        fake.stop()
        h.close()

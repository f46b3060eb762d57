"""The uplink follows the coordinator's hints: a 429 or 503 with `Retry-After: 3` is
retried after 3 s (not sooner, not after a minute); after a 400 the next report goes as
soon as the state changes (within one report interval), not after a fixed pause. A real
broker process reports to a small real HTTP server that answers from a script; its
`uplink.json` carries a key this version does not know, which the broker accepts."""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import nacl.signing
import pytest

from rbroker.uplink.config import FILE_NAME, UplinkConfig
from rbroker.uplink.keys import FileKeyStore
from tests.conftest import SINGLE_24G, BrokerProcess, short_tmp, start_broker, wait_until
from tests.fakes.coordinator import Answer, FakeCoordinator


@pytest.fixture
def scripted() -> Iterator[Any]:
    """`scripted(script)` → (FakeCoordinator, a broker enrolled at it), the script a list of
    (status, headers) answered in turn (detail "scripted STATUS"), then 200 with an
    acknowledgement. Stopped after."""
    made: list[tuple[FakeCoordinator, BrokerProcess]] = []

    def factory(
        script: list[tuple[int, dict[str, Any]]],
    ) -> tuple[FakeCoordinator, BrokerProcess]:
        fake = FakeCoordinator([Answer(s, headers=h, detail=f"scripted {s}") for s, h in script])
        url = fake.start()
        root = short_tmp()
        data = root / "data"
        FileKeyStore(data / "computer.key").save(nacl.signing.SigningKey.generate())
        UplinkConfig(url=url, computer_id="c_hints", group="g", name="lab-hints",
                     key_backend="file").save(data)  # fmt: skip
        # a key written by a newer version sharing this data dir
        raw = json.loads((data / FILE_NAME).read_text())
        (data / FILE_NAME).write_text(json.dumps({**raw, "proxy_hint": {"mode": "auto"}}))
        broker = start_broker(SINGLE_24G, root=root)
        made.append((fake, broker))
        return fake, broker

    yield factory
    for fake, broker in made:
        broker.stop()
        with contextlib.suppress(Exception):
            fake.stop()


def _link(broker: BrokerProcess) -> dict[str, Any]:
    with broker.client() as c:
        return dict(c.status()["coordinator"])


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_obeyed(scripted: Any, status: int) -> None:
    fake, broker = scripted([(status, {"Retry-After": "3"})])
    wait_until(lambda: len(fake.arrivals) >= 2, timeout_s=30, interval_s=0.05)
    gap = fake.arrivals[1] - fake.arrivals[0]
    print(f"{status} with Retry-After: 3 -> next attempt after {gap:.3f} s")
    assert 3.0 <= gap < 4.5, gap  # not sooner, and not after the usual backoff or a minute
    wait_until(lambda: _link(broker)["link"] == "ok", timeout_s=10, interval_s=0.1)


def test_retry_after_as_a_date(scripted: Any) -> None:
    from email.utils import formatdate

    fake, _ = scripted([(429, {"Retry-After": lambda: formatdate(time.time() + 4, usegmt=True)})])
    wait_until(lambda: len(fake.arrivals) >= 2, timeout_s=30, interval_s=0.05)
    gap = fake.arrivals[1] - fake.arrivals[0]
    # an HTTP date has whole seconds: 3 to 4 s from now, never the 0.5 s first backoff
    assert 2.9 <= gap < 5.5, gap


@pytest.mark.parametrize(
    ("status", "hint"),
    [
        (429, "0"),
        (503, "0"),
        (429, "past date"),
        (503, "past date"),
    ],
)
def test_a_zero_or_past_retry_after_never_sends_faster_than_one_report_a_second(
    scripted: Any, status: int, hint: str
) -> None:
    """A coordinator (or a proxy) that keeps answering `Retry-After: 0`, or an HTTP date
    already past, gets at most 7 reports in 6 s: the reports' minimum gap (1 s) holds."""
    from email.utils import formatdate

    value: Any = "0" if hint == "0" else (lambda: formatdate(time.time() - 10, usegmt=True))
    fake, broker = scripted([(status, {"Retry-After": value})] * 10_000)
    wait_until(lambda: len(fake.arrivals) >= 1, timeout_s=30, interval_s=0.02)
    first = fake.arrivals[0]
    time.sleep(6.0 - (time.monotonic() - first))
    in_6_s = [t for t in fake.arrivals if t - first < 6.0]
    gaps = [b - a for a, b in itertools.pairwise(in_6_s)]
    print(f"{status} Retry-After {hint}: {len(in_6_s)} reports in 6 s, gaps {gaps}")
    assert 4 <= len(in_6_s) <= 7, in_6_s
    assert min(gaps) >= 0.95, gaps
    assert f"{status} scripted {status} (retry after 1 s)" in str(_link(broker))


def test_after_a_400_the_next_report_follows_a_state_change(scripted: Any) -> None:
    fake, broker = scripted([(400, {})])
    wait_until(lambda: _link(broker)["link"].startswith("rejected: 400"), timeout_s=30)
    time.sleep(3.0)  # the state has not changed: nothing is sent again
    assert len(fake.arrivals) == 1, fake.arrivals
    interval_s = 5.0  # UplinkConfig.report_interval_s
    with broker.client() as c:
        changed_at = time.monotonic()
        c.call("lease.acquire", mib=1024, project="t", session="s", purpose="p")
        wait_until(lambda: len(fake.arrivals) >= 2, timeout_s=interval_s + 5, interval_s=0.02)
    delay = fake.arrivals[1] - changed_at
    print(f"after the 400, the next report went {delay:.3f} s after the state changed")
    assert delay <= interval_s, delay
    wait_until(lambda: _link(broker)["link"] == "ok", timeout_s=10, interval_s=0.1)
    # the unknown key of uplink.json survived the broker reading it
    assert json.loads((broker.data_dir / FILE_NAME).read_text())["proxy_hint"] == {"mode": "auto"}
